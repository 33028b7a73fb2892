"""Writing files so that a reader never sees half of one: write a temporary file beside the target, then
rename it over the target (atomic on POSIX and Windows within one folder)."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
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
    # Opened for reading too, so a writer may go back over what it wrote (cache entries hash their payload).
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "w+b") as handle:
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


class NotRegularFile(OSError):
    """A path that is not a regular file (a FIFO, a device such as /dev/zero, a directory, a socket)."""


class FileTooLarge(OSError):
    """A file larger than the bound its reader accepts."""


_KIND_NAMES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: Path, max_bytes: int) -> BinaryIO:
    """Open `path` for reading only if it is a regular file of at most `max_bytes` (symlinks to one are
    followed); raises NotRegularFile, FileTooLarge or another OSError, never blocks.

    O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever; the flag is cleared again, so a
    regular file reads as usual."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KIND_NAMES if test(info.st_mode)), "not a regular file")
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({kind})", str(path))
        if info.st_size > max_bytes:
            raise FileTooLarge(errno.EFBIG, f"larger than {size_text(max_bytes)}", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file `path` (at most `max_bytes`, see `open_regular`)."""
    with open_regular(path, max_bytes) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew after the check
        raise FileTooLarge(errno.EFBIG, f"larger than {size_text(max_bytes)}", str(path))
    return data


def size_text(nbytes: int) -> str:
    """A size for messages: `1.5 GiB`, `16.0 MiB`, `512 bytes`."""
    if nbytes >= 1 << 30:
        return f"{nbytes / (1 << 30):.1f} GiB"
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes >= 1 << 20 else f"{nbytes} bytes"


STALE_TEMP_AGE_S = 3600.0
_TEMP_NAME = re.compile(r"^\..+\.(\d+)\.[0-9a-f]{8}\.tmp$")


def remove_stale_temps(folder: Path, max_age_s: float = STALE_TEMP_AGE_S) -> int:
    """Remove the temporary files `write_atomic` left in `folder` when its process died (killed, disk
    full): those whose process is gone, or older than `max_age_s`. Never raises; how many were removed."""
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        try:
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            if _process_alive(int(match.group(1))) and now - entry.stat(follow_symlinks=False).st_mtime < max_age_s:
                continue
            os.unlink(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # exists but not ours, or cannot tell: leave it to the age rule
    return True
