"""Read a trace file's bytes with bounded memory: plain JSON, or gzip inflated in chunks.

Every trace file is opened through one guarded opener (`open_trace`: regular files only, so a FIFO or
/dev/zero is refused instead of hanging). Guards against adversarial files: a file (or the inflated content
of a `.gz`) larger than half of the memory this process may use (physical, or the cgroup limit) is refused with a clear error instead of driving the machine into swap or the
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
from torchscope.files import FileTooLarge, NotRegularFile, open_regular, read_regular, size_text

GZIP_MAGIC = b"\x1f\x8b"
INFLATE_CHUNK_BYTES = 16 << 20
READ_CHUNK_BYTES = 1 << 20
# What JSON text may start with (after whitespace): an object, an array, or a UTF-8/UTF-16 byte-order mark.
_JSON_FIRST_BYTES = frozenset(b"{[\xef\xff\xfe")


def max_trace_bytes() -> int:
    """The largest trace text torchscope will hold in memory: half of the memory this process may use
    (physical memory, or the container's cgroup limit when lower), at least 256 MiB."""
    return max(usable_memory_bytes() // 2, 256 << 20)


def usable_memory_bytes() -> int:
    """Physical memory, or the cgroup (container) memory limit when that is lower."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        physical = 1 << 41
    return min([physical, *_cgroup_limits()])


def _cgroup_limits() -> list[int]:
    limits = []
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = read_regular(Path(name), 4096).decode().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) > 0:
            limits.append(int(text))
    return limits


def _limit_reason(limit: int) -> str:
    return f"{_size(limit)}, half of the memory this process may use"


def open_trace(path: Path, limit: int) -> BinaryIO:
    """Open a trace file through the guarded opener: a regular file of at most `limit` bytes, never a
    FIFO or device (which would hang or never end); raises TraceFormatError with the reason."""
    try:
        return open_regular(path, limit)
    except FileTooLarge:
        raise TraceFormatError(path, f"file is larger than {_limit_reason(limit)}") from None
    except OSError as exc:
        raise _read_error(path, exc) from None


def read_trace_bytes(path: Path) -> bytes | bytearray:
    """The JSON text of a trace file, gunzipping `.gz` (or any gzip-magic) content."""
    limit = max_trace_bytes()
    with open_trace(path, limit) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise _read_error(path, exc) from None
    if data[:2] == GZIP_MAGIC:
        return gunzip(data, path, limit)
    if len(data) > limit:
        raise TraceFormatError(path, f"file is larger than {_limit_reason(limit)}")
    return data


def _read_error(path: Path, exc: OSError) -> TraceFormatError:
    if isinstance(exc, FileNotFoundError):
        return TraceFormatError(path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return TraceFormatError(path, "is a directory, not a trace file")
    if isinstance(exc, NotRegularFile):
        return TraceFormatError(path, f"{exc.strerror}, not a trace file")
    return TraceFormatError(path, f"cannot read file ({exc.strerror or exc})")


def estimated_text_bytes(path: Path) -> int | None:
    """The size of a trace's JSON text, to size its tables up front: the file size, or for gzip the
    size the trailer records (exact for one member under 4 GiB); None when unknown."""
    try:
        with open_regular(path, max_trace_bytes()) as handle:
            size = os.fstat(handle.fileno()).st_size
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
    with open_trace(path, limit) as handle:
        try:
            first = handle.read(chunk_bytes)
        except OSError as exc:
            raise _read_error(path, exc) from None
        if first[:2] == GZIP_MAGIC:
            yield from _inflate_chunks(first, handle, path, limit, chunk_bytes)
            return
        produced = 0
        while first:
            produced += len(first)
            if produced > limit:  # it grew after the check
                raise TraceFormatError(path, f"file is larger than {_limit_reason(limit)}")
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
                    raise TraceFormatError(path, f"gzip data inflates to more than {_limit_reason(limit)}")
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


def gunzip(data: bytes, path: Path | str, limit: int) -> bytes | bytearray:
    """Inflate all gzip members of `data`, refusing non-JSON content and more than `limit` bytes
    (the rules of `_inflate_chunks`)."""
    inflated = bytearray()  # grown in place: joining a list of chunks would need twice the memory
    for chunk in _inflate_chunks(data, io.BytesIO(), path, limit, INFLATE_CHUNK_BYTES):
        inflated += chunk
    return inflated  # a bytearray reads as bytes everywhere the parser uses it


def _check_json_start(chunk: bytes, path: Path | str) -> None:
    head = chunk[:4096].lstrip()
    if head and head[0] not in _JSON_FIRST_BYTES:
        raise TraceFormatError(path, f"gzip content is not JSON (it starts with {head[:16]!r})")


def _size(nbytes: int) -> str:
    return size_text(nbytes)
