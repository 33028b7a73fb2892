"""Read a trace file's bytes with bounded memory: plain JSON, or gzip inflated in chunks.

Guards against adversarial files: a file (or the inflated content of a `.gz`) larger than half of this
machine's physical memory is refused with a clear error instead of driving the machine into swap or the
OOM killer, and gzip content that does not start like JSON is rejected after the first chunk, so a
"zip bomb" of zeros or binary data costs one chunk, not gigabytes.
"""

from __future__ import annotations

import io
import os
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from torchscope.errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
INFLATE_CHUNK_BYTES = 16 << 20
READ_CHUNK_BYTES = 1 << 20
# What JSON text may start with (after whitespace): an object, an array, or a UTF-8/UTF-16 byte-order mark.
_JSON_FIRST_BYTES = frozenset(b"{[\xef\xff\xfe")


def max_trace_bytes() -> int:
    """The largest trace text torchscope will hold in memory: half of physical memory (at least 1 GiB)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 40
    return max(physical // 2, 1 << 30)


def read_trace_bytes(path: Path) -> bytes:
    """The JSON text of a trace file, gunzipping `.gz` (or any gzip-magic) content."""
    limit = max_trace_bytes()
    try:
        if path.stat().st_size > limit:
            raise TraceFormatError(path, f"file is larger than {_size(limit)} (half of this machine's memory)")
        data = path.read_bytes()
    except OSError as exc:
        raise _read_error(path, exc) from None
    if data[:2] == GZIP_MAGIC:
        return gunzip(data, path, limit)
    return data


def _read_error(path: Path, exc: OSError) -> TraceFormatError:
    if isinstance(exc, FileNotFoundError):
        return TraceFormatError(path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return TraceFormatError(path, "is a directory, not a trace file")
    return TraceFormatError(path, f"cannot read file ({exc.strerror or exc})")


def estimated_text_bytes(path: Path) -> int | None:
    """The size of a trace's JSON text, to size its tables up front: the file size, or for gzip the
    size the trailer records (exact for one member under 4 GiB); None when unknown."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            if handle.read(2) != GZIP_MAGIC:
                return size
            handle.seek(max(size - 4, 0))
            recorded = int.from_bytes(handle.read(4), "little")
    except OSError:
        return None
    return recorded if recorded >= size else None  # smaller than the file: wrapped past 4 GiB


def iter_trace_chunks(path: Path, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """The JSON text of a trace file in chunks of about `chunk_bytes`, gunzipping as it goes.

    Never holds more than one chunk (plus zlib's window): the streaming parser's input. The same checks
    as `read_trace_bytes` apply (missing file, directory, size limit, gzip bombs, damaged gzip)."""
    limit = max_trace_bytes()
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise _read_error(path, exc) from None
    with handle:
        try:
            if os.fstat(handle.fileno()).st_size > limit:
                raise TraceFormatError(path, f"file is larger than {_size(limit)} (half of this machine's memory)")
            first = handle.read(chunk_bytes)
        except OSError as exc:
            raise _read_error(path, exc) from None
        if first[:2] == GZIP_MAGIC:
            yield from _inflate_chunks(first, handle, path, limit, chunk_bytes)
            return
        while first:
            yield first
            first = handle.read(chunk_bytes)


def _inflate_chunks(
    first: bytes, handle: BinaryIO, path: Path | str, limit: int, chunk_bytes: int
) -> Iterator[bytes]:
    """Inflate every gzip member of `first` + the rest of `handle`, chunk by chunk. Content that does not
    start like JSON is refused after the first chunk, more than `limit` bytes as soon as it is passed;
    trailing zero padding is accepted, as gzip(1) does."""
    pending = first
    produced = 0
    eof = False
    while True:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # one gzip member
        try:
            while not inflater.eof:
                if not pending and not eof:
                    pending = handle.read(chunk_bytes)
                    eof = not pending
                chunk = inflater.decompress(pending, chunk_bytes)
                pending = inflater.unconsumed_tail
                if not chunk and not pending and eof:
                    raise TraceFormatError(path, "damaged gzip data (truncated: the stream ends early)")
                if not chunk:
                    continue
                if produced == 0:
                    _check_json_start(chunk, path)
                produced += len(chunk)
                if produced > limit:
                    raise TraceFormatError(
                        path, f"gzip data inflates to more than {_size(limit)} (half of this machine's memory)"
                    )
                yield chunk
        except zlib.error as exc:
            raise TraceFormatError(path, f"damaged gzip data ({exc})") from None
        pending = inflater.unused_data
        if len(pending) < 2 and not eof:
            pending += handle.read(chunk_bytes)
            eof = len(pending) < 2
        if pending[:2] != GZIP_MAGIC:
            rest = pending + (b"" if eof else handle.read())
            if rest.strip(b"\0"):
                raise TraceFormatError(path, "damaged gzip data (unexpected bytes after the end of the stream)")
            return  # trailing zero padding, as gzip(1) accepts


def gunzip(data: bytes, path: Path | str, limit: int) -> bytes:
    """Inflate all gzip members of `data`, refusing non-JSON content and more than `limit` bytes
    (the rules of `_inflate_chunks`)."""
    return b"".join(_inflate_chunks(data, io.BytesIO(), path, limit, INFLATE_CHUNK_BYTES))


def _check_json_start(chunk: bytes, path: Path | str) -> None:
    head = chunk[:4096].lstrip()
    if head and head[0] not in _JSON_FIRST_BYTES:
        raise TraceFormatError(path, f"gzip content is not JSON (it starts with {head[:16]!r})")


def _size(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):.1f} MiB"
