"""One capture driven by a framework's callbacks: start, one ``step()`` per optimizer step, finish.

The frameworks' callback classes are thin: they call this. A run that dies without the framework's end
callback (an exception Hugging Face's Trainer reports to no callback) is closed at interpreter exit, so
the partial window and the manifest are still written.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchscope.text import one_line

if TYPE_CHECKING:  # pragma: no cover
    from torchscope.capture.profiler import Profiler


class CaptureSession:
    """A :class:`~torchscope.capture.profiler.Profiler` opened and closed by callbacks.

    ``options`` are :class:`Profiler`'s keywords (schedule, ``record_shapes``, ``with_stack``, ...)."""

    def __init__(self, out: str | os.PathLike[str] = "runs", **options: Any) -> None:
        self.out = out
        self.options = options
        self.profiler: Profiler | None = None
        self.optimizer_steps = 0

    @property
    def run_dir(self) -> Path | None:
        return self.profiler.run_dir if self.profiler is not None else None

    def start(self) -> None:
        """Start recording (a second call while recording does nothing)."""
        if self.profiler is not None:
            return
        from torchscope.capture.profiler import Profiler

        self.profiler = Profiler(self.out, **self.options)
        self.profiler.start()
        atexit.register(self._close_at_exit)

    def step(self, optimizer_steps: int | None = None) -> None:
        """One training step ended. With ``optimizer_steps`` (the framework's counter), only when it moved
        on: micro-batches of gradient accumulation are one step, as under ``torchscope run``."""
        if self.profiler is None:
            return
        if optimizer_steps is not None:
            if optimizer_steps == self.optimizer_steps:
                return
            self.optimizer_steps = optimizer_steps
        self.profiler.step()

    def finish(self, exc: BaseException | None = None) -> None:
        """Stop recording, write the manifest and say where the run directory is."""
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        atexit.unregister(self._close_at_exit)
        from torchscope.capture.profiler import status_for_exception

        profiler.close(status_for_exception(exc))
        if profiler.run_dir is not None and profiler.trace_files:
            where = one_line(profiler.run_dir_text)
            try:
                sys.stderr.write(f"torchscope: run directory: {where} (report: torchscope analyze {where})\n")
            except Exception:  # a closed stderr must not fail the training's end
                pass

    def _close_at_exit(self) -> None:
        if self.profiler is not None:
            self.finish(RuntimeError("the training ended without its end callback"))


def missing(framework: str, extra: str) -> ImportError:
    """The one-line error for an integration whose framework is not installed."""
    return ImportError(f"torchscope.integrations.{extra} needs {framework}: pip install 'torchscope[{extra}]'")
