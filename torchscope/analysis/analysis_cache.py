"""Cache of per-file analysis results, so re-analysing an unchanged trace costs a file read.

An entry is the file's `SpanResult` as MessagePack, stored next to the parsed-table cache entry (same
folder rules, see `torchscope.trace.cache`). Its key is the table cache key (path, size, mtime, content
probes) plus a fingerprint of the analysis source code, so any change to the trace *or* to torchscope's
analyses invalidates it. A damaged entry is ignored and rewritten.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from torchscope import __version__
from torchscope.trace import cache as table_cache

if TYPE_CHECKING:
    from torchscope.analysis.rank import SpanResult

log = logging.getLogger(__name__)

_SUFFIX = ".analysis.msgpack"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the source of every module whose output ends up in a SpanResult."""
    package = Path(__file__).resolve().parents[1]
    import hashlib  # on use: it maps OpenSSL (~4 MB), which uncached runs do not need
    digest = hashlib.sha256(__version__.encode())
    for folder in ("trace", "analysis", "report"):
        for source in sorted((package / folder).glob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


def key_for(path: Path) -> str | None:
    try:
        import hashlib  # on use: it maps OpenSSL (~4 MB), which uncached runs do not need
        return hashlib.sha256((table_cache.cache_key(path) + code_fingerprint()).encode()).hexdigest()
    except OSError:
        return None


class _Entry(msgspec.Struct):
    key: str
    span: bytes  # the SpanResult, MessagePack-encoded


def _locations(path: Path, writable: bool = False) -> list[Path]:
    tables = table_cache.writable_locations(path) if writable else table_cache._locations(path)
    return [location.with_name(location.name.removesuffix(".npz") + _SUFFIX) for location in tables]


def load(path: Path, key: str) -> "SpanResult | None":
    from torchscope.analysis.rank import SpanResult

    for location in _locations(path):
        try:
            entry = msgspec.msgpack.decode(location.read_bytes(), type=_Entry)
            if entry.key == key:
                return msgspec.msgpack.decode(entry.span, type=SpanResult)
        except FileNotFoundError:
            continue
        except Exception as exc:  # any damage means: recompute
            log.debug("ignoring analysis cache entry %s: %s", location, exc)
    return None


def store(path: Path, key: str, span: "SpanResult") -> Path | None:
    payload = msgspec.msgpack.encode(_Entry(key, msgspec.msgpack.encode(span)))
    for location in _locations(path, writable=True):
        try:
            location.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = table_cache.temp_file_in(location.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(payload)
                os.replace(tmp, location)
            except BaseException:
                os.unlink(tmp)
                raise
            return location
        except OSError as exc:
            log.debug("cannot write analysis cache entry %s: %s", location, exc)
    return None
