"""SIGINT/SIGTERM around the profiler.

* :class:`DeferredSignals` holds SIGINT and SIGTERM back while torchscope is inside the profiler
  (a step transition, a trace export), then re-delivers them to whatever handler was installed. A
  ``KeyboardInterrupt`` raised half-way through ``torch.profiler``'s state change would lose the trace.
* :class:`SigtermSaver` saves the capture on SIGTERM, then ends the process the way the default
  handler would (``SIG_DFL`` + re-kill), so the exit status stays "killed by SIGTERM".

Signal handlers can only be changed from the main thread; elsewhere both are no-ops.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType
from typing import Any, Callable

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class DeferredSignals:
    """Re-entrant context manager: signals that arrive inside are delivered on the way out."""

    def __init__(self) -> None:
        self._depth = 0
        self._saved: dict[int, Any] = {}
        self._pending: list[int] = []

    def __enter__(self) -> DeferredSignals:
        if self._depth == 0 and _in_main_thread():
            self._pending = []
            for signum in _DEFERRED:
                previous = signal.getsignal(signum)
                if previous is None:  # installed from C: cannot be restored, leave it alone
                    continue
                try:
                    signal.signal(signum, self._record)
                except (ValueError, OSError):
                    continue
                self._saved[signum] = previous
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
        self._saved = {}
        pending, self._pending = self._pending, []
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)  # now handled by the restored handler

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)


class SigtermSaver:
    """While installed, SIGTERM runs ``save()`` and then terminates the process as SIG_DFL would.

    Installed only when SIGTERM has its default disposition: a handler the program set itself is
    respected (its own semantics win), and one the script installs later replaces ours.
    """

    def __init__(self, save: Callable[[], None]) -> None:
        self._save = save
        self._installed = False

    def install(self) -> bool:
        if not _in_main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return True

    def uninstall(self) -> None:
        if self._installed and _in_main_thread() and signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        try:
            self._save()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
