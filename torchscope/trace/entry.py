"""The envelope of a cache entry (tables and extracts): what it is keyed on and a checksum of its bytes,
read before anything is decoded or decompressed.

```
magic (8 bytes) | key (64 ASCII hex) | payload length (8 bytes, little-endian) | SHA-256 of the payload | payload
```

A reader opens the entry through the guarded opener (a regular file, a bounded size), compares the key
first (a foreign or stale entry costs 112 bytes of reading), then checks the length against the file and
the bound, and hashes the payload in chunks; only then is it decoded. A flipped bit anywhere is a
checksum mismatch, never a changed report. Writers go through `write_atomic` into a cache folder that is
a real folder (never a symlink), and remove the temporary files an earlier killed run left there.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

from torchscope.files import open_regular, remove_stale_temps, write_atomic

log = logging.getLogger(__name__)

MAGIC = b"TSCACHE1"
_HEADER_BYTES = len(MAGIC) + 64 + 8 + 32
_HASH_CHUNK = 1 << 20


class DamagedEntry(ValueError):
    """A cache entry whose envelope does not hold together (bad magic, length or checksum)."""


def open_entry(location: Path, key: str, max_bytes: int) -> BinaryIO | None:
    """The entry's payload as a file positioned at its start, when `location` is a regular file of at most
    `max_bytes` holding `key` and an intact payload; None for another key. Raises OSError or
    DamagedEntry. The caller closes the file."""
    handle = open_regular(location, max_bytes)
    try:
        header = handle.read(_HEADER_BYTES)
        if len(header) < _HEADER_BYTES or not header.startswith(MAGIC):
            raise DamagedEntry("not a torchscope cache entry")
        if header[len(MAGIC) : len(MAGIC) + 64] != key.encode("ascii"):
            handle.close()
            return None
        length = int.from_bytes(header[len(MAGIC) + 64 : len(MAGIC) + 72], "little")
        if length != os.fstat(handle.fileno()).st_size - _HEADER_BYTES:
            raise DamagedEntry("length does not match the file")
        if _payload_digest(handle) != header[len(MAGIC) + 72 :]:
            raise DamagedEntry("checksum mismatch")
        handle.seek(_HEADER_BYTES)
        return handle
    except BaseException:
        handle.close()
        raise


def _payload_digest(handle: BinaryIO) -> bytes:
    import hashlib  # on use, as in cache.py: it maps OpenSSL (~4 MB), which uncached runs do not need

    digest = hashlib.sha256()
    while chunk := handle.read(_HASH_CHUNK):
        digest.update(chunk)
    return digest.digest()


def write_entry(location: Path, key: str, write_payload: Callable[[BinaryIO], object]) -> None:
    """Write an entry for `key` atomically; raises OSError (also when its folder is a symlink)."""
    folder = location.parent
    make_cache_folder(folder)
    remove_stale_temps(folder)

    def write(handle: BinaryIO) -> None:
        handle.write(bytes(_HEADER_BYTES))  # the header is filled in once the payload is known
        write_payload(handle)
        handle.flush()
        length = handle.tell() - _HEADER_BYTES
        handle.seek(_HEADER_BYTES)
        digest = _payload_digest(handle)
        handle.seek(0)
        handle.write(MAGIC + key.encode("ascii") + length.to_bytes(8, "little") + digest)

    write_atomic(location, write)


def make_cache_folder(folder: Path) -> None:
    """Create the cache folder if needed; refuse (OSError) one that is a symlink or not a folder, so an
    entry is never written into the place a link points to."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        folder.mkdir(parents=True, exist_ok=True)
        info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{folder} is a symlink or not a folder: not written")


def read_unchecked(location: Path, max_bytes: int = 1 << 30) -> tuple[str, bytes]:
    """(key, payload) of an entry without checking the checksum: for tests and tools that look inside."""
    with open_regular(location, max_bytes) as handle:
        header = handle.read(_HEADER_BYTES)
        return header[len(MAGIC) : len(MAGIC) + 64].decode("ascii"), handle.read()
