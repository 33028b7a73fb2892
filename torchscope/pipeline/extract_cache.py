"""Cache of per-file analysis extracts, so re-analysing an unchanged trace costs a file read.

One entry per trace file, next to its table cache entry (same folder rules, see `trace/cache.py`). It
holds each analysis's extract (MessagePack) under that analysis's fingerprint: the trace's table key
(file identity and schema fingerprint) plus the source of the analysis layers and of the module that
defines the extract. An extract is served only when its fingerprint matches, so a changed trace, schema,
torchscope version or analysis code recomputes exactly what it affects. A damaged or foreign entry is
ignored and rewritten. The entry sits in the checksummed envelope of `trace/entry.py`, keyed on the table
key: a flipped bit is detected and recomputed, never served.
"""

from __future__ import annotations

import functools
import inspect
import logging
from pathlib import Path
from typing import Any

import msgspec

from torchscope.analysis.registry import Analysis
from torchscope.trace import cache as table_cache
from torchscope.trace import entry

log = logging.getLogger(__name__)

_SUFFIX = ".extracts.msgpack"
_PACKAGE = Path(__file__).resolve().parents[1]
_LAYERS = ("trace", "analysis", "report")  # what an extract's value depends on, besides its own module
MAX_ENTRY_BYTES = 256 << 20  # extracts are summaries (a few KB to MB): anything larger is not an entry


class _Extract(msgspec.Struct):
    fingerprint: str
    data: bytes  # the extract, MessagePack-encoded


class _Entry(msgspec.Struct):
    extracts: dict[str, _Extract]


@functools.lru_cache(maxsize=1)
def _layers_digest() -> str:
    import hashlib  # on use, as in trace/cache.py: it maps OpenSSL (~4 MB), which uncached runs do not need

    digest = hashlib.sha256()
    for folder in _LAYERS:
        for source in sorted((_PACKAGE / folder).glob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _module_digest(module_file: str | None) -> str:
    if module_file is None:
        return ""
    import hashlib

    try:
        return hashlib.sha256(Path(module_file).read_bytes()).hexdigest()
    except OSError:
        return ""


def fingerprint(analysis: Analysis[Any], trace_key: str) -> str:
    """The key an analysis's extract of one trace file is cached under."""
    module_file = inspect.getsourcefile(analysis.extract) if inspect.isfunction(analysis.extract) else None
    parts = (trace_key, _layers_digest(), analysis.name, repr(analysis.extract_type), _module_digest(module_file))
    import hashlib

    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _locations(path: Path, writable: bool = False) -> list[Path]:
    tables = table_cache.writable_locations(path) if writable else table_cache.locations(path)
    return [location.with_name(location.name.removesuffix(".npz") + _SUFFIX) for location in tables]


def load(path: Path, trace_key: str) -> dict[str, _Extract]:
    """The cached extracts of `path` by analysis name (empty when there is no usable entry): an entry is
    read only when its envelope holds `trace_key` and its checksum matches (`trace/entry.py`)."""
    for location in _locations(path):
        try:
            handle = entry.open_entry(location, trace_key, MAX_ENTRY_BYTES)
            if handle is None:
                continue
            with handle:
                return msgspec.msgpack.decode(handle.read(), type=_Entry).extracts
        except FileNotFoundError:
            continue
        except Exception as exc:  # any damage means: recompute
            log.debug("ignoring extract cache entry %s: %s", location, exc)
    return {}


def cached_value(entry: dict[str, _Extract], analysis: Analysis[Any], key: str) -> tuple[bool, Any]:
    """(True, value) when `entry` holds this analysis's extract under fingerprint `key`."""
    found = entry.get(analysis.name)
    if found is None or found.fingerprint != key:
        return False, None
    try:
        return True, msgspec.msgpack.decode(found.data, type=analysis.extract_type)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as exc:
        log.debug("ignoring cached extract %s: %s", analysis.name, exc)
        return False, None


def store(path: Path, trace_key: str, extracts: dict[str, tuple[str, Any]]) -> Path | None:
    """Write the extracts ({name: (fingerprint, value)}) of `path`, whose tables have `trace_key`; where,
    or None (never raises)."""
    values = {}
    for name, (key, value) in extracts.items():
        try:
            values[name] = _Extract(key, msgspec.msgpack.encode(value))
        except (OverflowError, TypeError, ValueError) as exc:  # msgpack cannot hold it: this one is recomputed
            log.debug("cannot encode the %s extract of %s: %s", name, path, exc)
    if not values:
        return None
    payload = msgspec.msgpack.encode(_Entry(values))
    if len(payload) > MAX_ENTRY_BYTES:
        return None
    for location in _locations(path, writable=True):
        try:
            entry.write_entry(location, trace_key, lambda handle: handle.write(payload))
            return location
        except OSError as exc:
            log.debug("cannot write extract cache entry %s: %s", location, exc)
    return None
