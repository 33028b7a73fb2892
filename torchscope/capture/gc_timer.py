"""Python's garbage collections timed in the unprofiled steps (``gc.callbacks``), for the step clock.

A full collection walks every tracked object the process holds: with millions of them (a dataset index, a
cache of dicts) it stops the training thread for hundreds of milliseconds, once every few dozen steps. The
recorded window (3 steps) rarely holds one; the 30 unprofiled steps the step clock times often do, and
their durations then show an outlier with no cause. Timing each collection there (two ``perf_counter``
reads per collection, by generation) names it.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Optional


class GcTimer:
    """Time in garbage collections, all generations and full ones (generation 2), and the longest pause,
    since the last :meth:`take`."""

    def __init__(self) -> None:
        self._started: Optional[float] = None
        self._total = 0.0
        self._full = 0.0
        self._count = 0
        self._longest = 0.0
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:  # the script replaced gc.callbacks: nothing of ours is left in it
                pass
            self.installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the interpreter around every collection, in whichever thread triggered it: never raise.
        try:
            if phase == "start":
                self._started = time.perf_counter()
                return
            if self._started is None:
                return
            pause = time.perf_counter() - self._started
            self._started = None
            self._total += pause
            self._count += 1
            if info.get("generation") == 2:
                self._full += pause
            self._longest = max(self._longest, pause)
        except Exception:
            pass

    def take(self) -> tuple[float, float, int, float]:
        """(seconds in all collections, seconds in full ones, collections, the longest one's seconds) since
        the last call."""
        taken = (self._total, self._full, self._count, self._longest)
        self._total = self._full = self._longest = 0.0
        self._count = 0
        return taken
