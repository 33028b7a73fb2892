"""Python's garbage collections timed in the unprofiled steps (``gc.callbacks``), for the step clock.

A full collection walks every tracked object the process holds: with millions of them (a dataset index, a
cache of dicts) it stops the training thread for hundreds of milliseconds, once every few dozen steps. The
recorded window (3 steps) rarely holds one; the 30 unprofiled steps the step clock times often do, and
their durations then show an outlier with no cause. Timing each collection there (two ``perf_counter``
reads per collection, by generation) names it.

Collections while torch.compile compiles are left out: dynamo calls ``gc.collect()`` itself and allocates
enough to trigger many more, and all of it is compilation's cost (the trace's compile ranges count it).
Dynamo's compile callbacks say when it compiles; they are followed once the script has loaded dynamo.
"""

from __future__ import annotations

import gc
import sys
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
        self._compiling = False
        self._dynamo_callbacks: Any = None  # torch._dynamo's callback handler, once ours are registered on it
        self._registering = False

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
        if self._dynamo_callbacks:
            handler = self._dynamo_callbacks
            # Every copy (a collection inside the registration itself may have added a second); none left after
            # torch._dynamo.reset() cleared them.
            handler.start_callbacks[:] = [c for c in handler.start_callbacks if c != self._compile_started]
            handler.end_callbacks[:] = [c for c in handler.end_callbacks if c != self._compile_ended]
            self._dynamo_callbacks = None
            self._compiling = False

    def _follow_compilation(self) -> None:
        """Keep our callbacks on dynamo's compile callbacks once the script has imported dynamo (this never
        imports it; `torch._dynamo.reset()` clears them, so they are looked for at each collection)."""
        handler = getattr(sys.modules.get("torch._dynamo.callback"), "callback_handler", None)
        if handler is None or self._registering:
            return
        self._registering = True  # a collection triggered in here calls back into this method
        try:
            if self._compile_started not in handler.start_callbacks:
                handler.register_start_callback(self._compile_started)
                handler.register_end_callback(self._compile_ended)
                self._dynamo_callbacks = handler
                # Registered during a compilation (the script's first, at its first collection): its end
                # callback still comes. The count is private to the handler: none read means none known.
                self._compiling = getattr(handler, "_CompilationCallbackHandler__pending_callbacks_counter", 0) > 0
        except Exception:  # another release's handler: collections are then all timed, as before
            pass
        finally:
            self._registering = False

    def _compile_started(self, *args: Any) -> None:
        self._compiling = True

    def _compile_ended(self, *args: Any) -> None:
        self._compiling = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Called by the interpreter around every collection, in whichever thread triggered it: never raise.
        try:
            if phase == "start":
                self._follow_compilation()
                self._started = None if self._compiling or _dynamo_collects() else time.perf_counter()
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
        self._follow_compilation()  # at each step's end too: a compilation starting before any collection is seen
        taken = (self._total, self._full, self._count, self._longest)
        self._total = self._full = self._longest = 0.0
        self._count = 0
        return taken


def _dynamo_collects() -> bool:
    """Whether dynamo itself runs this collection: `gc.collect()` at the end of its compile entry point
    (`run_gc_after_compile`), after its compile callbacks have ended. That module runs only to compile."""
    try:
        frame = sys._getframe(2)  # the code that triggered the collection (past _callback and this function)
    except ValueError:  # no Python frame there: at shutdown, or a thread started from C++
        return False
    return frame.f_code.co_filename.replace("\\", "/").endswith("torch/_dynamo/convert_frame.py")
