"""Keeping torch's and Kineto's own log lines about the capture off the script's stderr.

Starting, stepping and stopping ``torch.profiler`` makes the C++ side print lines the user did not ask
for (``USDT: ... profiler_start``, ``External init callback must run in same thread``), and with memory
profiling c10 warns for every tensor freed that was allocated before (``CPUAllocator.cpp:245 ...``). They
are written by C++ straight to file descriptor 2, so they are filtered there:

* around torchscope's own calls into the profiler, fd 2 goes to a temporary file, and what was written
  is replayed to the real stderr without the known noise lines (nothing else is lost or reordered
  within that call);
* c10's warnings are raised to ERROR level while torch is imported by ``torchscope run``
  (``TORCH_CPP_LOG_LEVEL``, read once then; a value the user set is left alone, and the variable is
  removed again so the script's environment is unchanged).

``-v/--verbose`` keeps all of it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from contextlib import contextmanager
from typing import Iterator

NOISE = re.compile(
    rb"USDT:.*profiler_(start|stop)|CPUAllocator\.cpp:\d+\]|External init callback must run in same thread"
)
_LOG_LEVEL_VARIABLE = "TORCH_CPP_LOG_LEVEL"


def without_noise(text: bytes) -> bytes:
    """`text` without the lines that match NOISE."""
    return b"".join(line for line in text.splitlines(keepends=True) if not NOISE.search(line))


@contextmanager
def native_stderr_filtered(enabled: bool = True) -> Iterator[None]:
    """While inside, what C++ (or anything) writes to fd 2 is held and replayed without noise lines."""
    if not enabled:
        yield
        return
    try:
        _flush_stderr()
        held = _held_fd()
        saved = os.dup(2)
        os.dup2(held, 2)
    except (OSError, ValueError):  # no temporary file (disk full), no fd 2: nothing to filter with
        yield
        return
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        _replay(held)


# One holding file per process, reused by every filtered call: this runs around each profiler step, inside
# the measured step time, so creating a temporary file each time (a few syscalls, more on a busy disk)
# would be charged to the user's step. Keyed by pid: a forked child gets its own.
_HELD: dict[int, int] = {}


def _held_fd() -> int:
    pid = os.getpid()
    if pid not in _HELD:
        handle = tempfile.TemporaryFile()
        _HELD[pid] = os.dup(handle.fileno())  # the descriptor outlives the (closed) Python object
        handle.close()
    return _HELD[pid]


def _replay(held: int) -> None:
    try:
        size = os.fstat(held).st_size
        if size:
            os.lseek(held, 0, os.SEEK_SET)
            text = b""
            while len(text) < size:
                chunk = os.read(held, size - len(text))
                if not chunk:
                    break
                text += chunk
            kept = without_noise(text)
            while kept:
                kept = kept[os.write(2, kept) :]
        os.ftruncate(held, 0)
        os.lseek(held, 0, os.SEEK_SET)
    except OSError:
        pass


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except Exception:
        pass


@contextmanager
def quiet_torch_import(enabled: bool = True) -> Iterator[None]:
    """Import torch inside this block with c10's warnings at ERROR level (see the module docstring)."""
    if not enabled or _LOG_LEVEL_VARIABLE in os.environ or "torch" in sys.modules:
        yield
        return
    os.environ[_LOG_LEVEL_VARIABLE] = "ERROR"
    try:
        yield
    finally:
        os.environ.pop(_LOG_LEVEL_VARIABLE, None)
