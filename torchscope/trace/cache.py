"""Persistent cache of parsed trace tables, so re-analysing an unchanged trace skips JSON parsing.

Entries are uncompressed `.npz` files (numpy arrays only, loaded with `allow_pickle=False`): the columns,
the string table as one UTF-8 blob with offsets, and the header as JSON. An entry sits in
`.torchscope-cache/` next to the trace, or under `$XDG_CACHE_HOME/torchscope` (default `~/.cache`) when
that folder is not writable (or has no write permission bits, even for root, or is a symlink). The key
covers the file's identity (real path, size, mtime and ctime, inode), a CRC of its first and last MiB and
the schema fingerprint, so a changed or different file is never served from a stale entry. Each entry sits
in a checksummed envelope (`trace/entry.py`): the key is compared before anything is decoded, the bytes
are hashed before they are trusted, and a corrupt or foreign entry is ignored and rebuilt.
"""

from __future__ import annotations

import functools
import logging
import os
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from torchscope import __version__
from torchscope.files import open_regular
from torchscope.rundir.layout import CACHE_DIR
from torchscope.text import path_text
from torchscope.trace import entry, fastscan, schema, validate
from torchscope.trace.read import max_trace_bytes
from torchscope.trace.sparse import SparseColumn, share_rows
from torchscope.trace.tables import (
    ALL_COLUMNS,
    DERIVED_COLUMNS,
    NUMERIC_COLUMNS,
    SPARSE_COLUMNS,
    STRING_COLUMNS,
    EventTable,
    TraceFile,
)

log = logging.getLogger(__name__)

CACHE_FORMAT = 4  # 2: fewer, narrower columns; 3: canonical string ids (sorted text); 4: sparse columns
_DTYPES = {
    **{c: np.dtype(t) for c, t in NUMERIC_COLUMNS.items()},
    **{c: np.dtype(np.int32) for c in STRING_COLUMNS},
    **{c: np.dtype(t) for c, t in DERIVED_COLUMNS.items()},
}
_PROBE_BYTES = 1 << 20


@functools.lru_cache(maxsize=1)
def schema_fingerprint() -> str:
    """What decides how a trace becomes tables: torchscope's version, the cache format, the declared
    argument fields and kinds (trace/schema.py) and the compiled scanner's spec version. A table cached
    under another fingerprint is never served (a scanner or schema fix invalidates old entries)."""
    declared = (
        __version__,
        CACHE_FORMAT,
        fastscan.SPEC_VERSION,
        sorted((column, key, repr(kind), _stable_repr(default)) for column, (key, kind, default) in schema.ARG_FIELDS.items()),
        [(sorted(int(k) for k in group.kinds), list(group.columns)) for group in schema.ARG_GROUPS],
        sorted(NUMERIC_COLUMNS.items()),
        list(STRING_COLUMNS),
    )
    return repr(declared)


def _stable_repr(value: Any) -> str:
    """A repr that is the same in every process (msgspec.Raw's default repr holds its address)."""
    return f"Raw({bytes(value)!r})" if isinstance(value, msgspec.Raw) else repr(value)


def cache_key(path: Path) -> str:
    """Key of a trace file's tables: the file's identity and content (real path, size, mtime and ctime in
    ns, device and inode, CRCs of its first and last MiB) and the schema fingerprint. A file rewritten in
    place with its mtime restored still changes its ctime, so it is never served from a stale entry.
    Raises OSError (also for a path that is not a regular file)."""
    with open_regular(path, max_trace_bytes()) as handle:
        info = os.fstat(handle.fileno())
        head = handle.read(_PROBE_BYTES)
        handle.seek(max(info.st_size - _PROBE_BYTES, 0))
        tail = handle.read(_PROBE_BYTES)
    identity = (os.fsencode(os.path.realpath(path)), info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_dev, info.st_ino)
    parts = (schema_fingerprint(), identity, zlib.crc32(head), zlib.crc32(tail))
    import hashlib  # on use: it maps OpenSSL (~4 MB), which uncached runs do not need
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def locations(path: Path) -> list[Path]:
    resolved = Path(os.path.realpath(path))
    local = resolved.parent / CACHE_DIR / f"{path.name}.npz"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    import hashlib  # on use: it maps OpenSSL (~4 MB), which uncached runs do not need
    digest = hashlib.sha1(os.fsencode(resolved)).hexdigest()[:20]
    return [local, base / "torchscope" / f"{digest}-{path.name}.npz"]


def writable_locations(path: Path) -> list[Path]:
    """The cache locations we may write. A folder without any write permission bit is treated as
    read-only even for root (which the kernel would let through), so shared trace folders stay clean;
    a cache folder that is a symlink is never written through."""
    return [location for location in locations(path) if _may_write(location.parent)]


def _may_write(folder: Path) -> bool:
    if folder.is_symlink():
        return False
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            return False
        existing = existing.parent
    try:
        mode = existing.stat().st_mode
    except OSError:
        return False
    return existing.is_dir() and bool(mode & 0o222) and os.access(existing, os.W_OK)


def load_cached(path: Path, key: str) -> TraceFile | None:
    for location in locations(path):
        try:
            handle = entry.open_entry(location, key, max_trace_bytes())
        except FileNotFoundError:
            continue
        except Exception as exc:  # any damage to an entry means: rebuild it
            log.debug("ignoring cache entry %s: %s", location, exc)
            continue
        if handle is None:
            continue  # another file's or an older version's entry
        try:
            with handle:
                return _read_entry(handle, path)
        except Exception as exc:  # any damage to an entry means: rebuild it
            log.debug("ignoring cache entry %s: %s", location, exc)
    return None


def _read_entry(handle: BinaryIO, path: Path) -> TraceFile:
    _check_members(handle)
    with np.load(handle, allow_pickle=False) as data:
        meta = _json().loads(bytes(data["__meta__"]).decode())
        blob = bytes(data["__strings__"])
        offsets = data["__offsets__"]
        strings = [blob[offsets[i] : offsets[i + 1]].decode("utf-8", "surrogatepass") for i in range(offsets.size - 1)]
        columns: dict[str, Any] = {name: np.array(data[name]) for name in ALL_COLUMNS if name not in SPARSE_COLUMNS}
        sparse = {name: (np.array(data[f"{name}.rows"]), np.array(data[f"{name}.values"]), data[f"{name}.default"]) for name in SPARSE_COLUMNS}
    lengths = {c.size for c in columns.values()}
    if len(lengths) != 1 or any(c.ndim != 1 or c.dtype != _DTYPES[name] for name, c in columns.items()):
        raise ValueError("inconsistent columns")
    size = lengths.pop()
    for name, (rows, values, default) in sparse.items():
        if rows.dtype != np.int64 or values.dtype != _DTYPES[name] or rows.shape != values.shape or rows.ndim != 1 or default.shape != ():
            raise ValueError("inconsistent sparse column")
        if rows.size and (rows[0] < 0 or rows[-1] >= size or not (rows[1:] > rows[:-1]).all()):
            raise ValueError("sparse rows out of order or range")
        columns[name] = SparseColumn(size, rows, values, default.astype(values.dtype))
    share_rows(c for c in columns.values() if isinstance(c, SparseColumn))
    if any(int(c.max(initial=0)) >= len(strings) or int(c.min(initial=0)) < 0 for c in _string_columns(columns)):
        raise ValueError("string ids out of range")
    if not isinstance(meta.get("header"), dict) or not isinstance(meta.get("warnings", []), list):
        raise ValueError("bad metadata")
    header = validate.clean_header(meta["header"])
    return TraceFile(path_text(path), header, EventTable(columns, strings), meta.get("warnings", []))


def _check_members(handle: BinaryIO) -> None:
    """Refuse an archive whose members would inflate: entries are written uncompressed, so a compressed
    member (or more content than the file holds) is a crafted or foreign entry."""
    start = handle.tell()
    size = os.fstat(handle.fileno()).st_size - start
    import zipfile  # on use: only cache entries need it (9 ms of imports at start otherwise)

    with zipfile.ZipFile(handle) as archive:
        members = archive.infolist()
    if any(m.compress_type != zipfile.ZIP_STORED for m in members) or sum(m.file_size for m in members) > size:
        raise ValueError("compressed or oversized members")
    handle.seek(start)


def _string_columns(columns: dict[str, Any]) -> list[np.ndarray]:
    """The ids each string column holds (a sparse one: its values and its default)."""
    return [np.append(c.values, c.default) if isinstance(c, SparseColumn) else c for c in (columns[c] for c in STRING_COLUMNS)]


def store(path: Path, key: str, trace: TraceFile) -> Path | None:
    """Write an entry; returns where, or None when no location is writable (never raises)."""
    encoded = [s.encode("utf-8", "surrogatepass") for s in trace.events.strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    meta = {"key": key, "header": trace.header, "warnings": trace.warnings}
    arrays: dict[str, Any] = {
        "__meta__": np.frombuffer(_json().dumps(meta, default=str).encode(), dtype=np.uint8),
        "__strings__": np.frombuffer(b"".join(encoded), dtype=np.uint8),
        "__offsets__": offsets,
        **{name: c for name, c in trace.events.columns.items() if not isinstance(c, SparseColumn)},
    }
    for name, column in trace.events.columns.items():
        if isinstance(column, SparseColumn):
            arrays.update({f"{name}.rows": column.rows, f"{name}.values": column.values, f"{name}.default": np.asarray(column.default)})
    for location in writable_locations(path):
        try:
            entry.write_entry(location, key, lambda handle: np.savez(handle, **arrays))
            return location
        except OSError as exc:
            log.debug("cannot write cache entry %s: %s", location, exc)
    return None


def _json() -> Any:
    """The json module, imported on first use: only cache entries need it (and it keeps NaN in headers
    as the parse gave it, where msgspec would write null)."""
    import json

    return json
