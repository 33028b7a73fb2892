"""SIGINT/SIGTERM around the profiler.

* :class:`DeferredSignals` holds SIGINT and SIGTERM back while torchscope is inside the profiler
  (a step transition, a trace export), then re-delivers them to whatever handler was installed. A
  ``KeyboardInterrupt`` raised half-way through ``torch.profiler``'s state change would lose the trace.
* :class:`SigtermSaver` saves the capture on SIGTERM, then ends the process the way the default
  handler would (``SIG_DFL`` + re-kill), so the exit status stays "killed by SIGTERM".

Signal handlers can only be changed from the main thread; elsewhere both are no-ops. A process forked
while they are installed (a `multiprocessing` pool with the fork start method) inherits them: there they
act as the handler they replaced would (the child has no capture to save, and `Pool.terminate()` ends its
workers with SIGTERM: a worker that kept the signal waited for its task queue for ever).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Callable

_DEFERRED = (signal.SIGINT, signal.SIGTERM)
_OURS: dict[int, Any] = {}  # signal -> (our handler, the one it replaced), while installed


def _restore_in_child() -> None:
    """After a fork, in the child: the handlers ours replaced, before any Python code of the child runs.
    A Pool worker that kept SigtermSaver's handler sometimes outlived `Pool.terminate()` (30 runs of a
    fork pool under `torchscope run`, three at a time: 2 hung; none with the default handler)."""
    for signum, (handler, previous) in list(_OURS.items()):
        try:
            if signal.getsignal(signum) == handler:
                signal.signal(signum, previous)
        except (ValueError, OSError):
            pass
    _OURS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restore_in_child)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class DeferredSignals:
    """Re-entrant context manager: signals that arrive inside are delivered on the way out."""

    def __init__(self) -> None:
        self._depth = 0
        self._saved: dict[int, Any] = {}
        self._pending: list[int] = []
        self._outer: dict[int, Any] = {}
        self._pid = os.getpid()

    def __enter__(self) -> DeferredSignals:
        if self._depth == 0 and _in_main_thread():
            self._pending = []
            self._pid = os.getpid()
            for signum in _DEFERRED:
                previous = signal.getsignal(signum)
                if previous is None:  # installed from C: cannot be restored, leave it alone
                    continue
                try:
                    signal.signal(signum, self._record)
                except (ValueError, OSError):
                    continue
                self._saved[signum] = previous
                outer = self._outer[signum] = _OURS.get(signum)  # SigtermSaver's, when it is the one replaced
                # A child forked in here gets the program's handler back, not SigtermSaver's.
                _OURS[signum] = (self._record, outer[1] if outer is not None and outer[0] == previous else previous)
        self._depth += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._depth -= 1
        if self._depth > 0 or not self._saved:
            return
        for signum, previous in self._saved.items():
            signal.signal(signum, previous)
            outer = self._outer.pop(signum, None)
            if outer is None:
                _OURS.pop(signum, None)
            else:
                _OURS[signum] = outer
        self._saved = {}
        pending, self._pending = self._pending, []
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)  # now handled by the restored handler

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked child: the handler this one replaced, now
            signal.signal(signum, self._saved.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self._pending.append(signum)


class SigtermSaver:
    """While installed, SIGTERM runs ``save()`` and then terminates the process as SIG_DFL would.

    Installed only when SIGTERM has its default disposition: a handler the program set itself is
    respected (its own semantics win), and one the script installs later replaces ours.
    """

    def __init__(self, save: Callable[[], None]) -> None:
        self._save = save
        self._installed = False
        self._pid = os.getpid()

    def install(self) -> bool:
        if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        self._pid = os.getpid()
        signal.signal(signal.SIGTERM, self._handle)
        _OURS[signal.SIGTERM] = (self._handle, signal.SIG_DFL)
        self._installed = True
        return True

    def uninstall(self) -> None:
        if self._installed and _in_main_thread() and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _OURS.pop(signal.SIGTERM, None)
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        try:
            if os.getpid() == self._pid:  # a forked child has no capture of its own to save
                self._save()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
