"""Writing files so that a reader never sees half of one: write a temporary file beside the target, then
rename it over the target (atomic on POSIX and Windows within one folder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable, Union

Content = Union[bytes, Callable[[BinaryIO], None]]


def write_atomic(path: Path, content: Content, *, fsync: bool = False) -> None:
    """Write `content` (bytes, or a function that writes to a binary file) to `path` through a temporary
    file in the same folder; raises OSError. The file gets the usual permissions (0666 less the umask).

    `fsync` also forces the bytes to disk before the rename (for manifests, which must survive a crash
    right after the capture)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # O_EXCL: never write through a file or link someone put there; 0o666: the umask applies, as for open().
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            if isinstance(content, bytes):
                handle.write(content)
            else:
                content(handle)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
