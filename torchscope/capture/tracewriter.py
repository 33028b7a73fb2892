"""The ``on_trace_ready`` callback: one Kineto trace file per schedule cycle, never an exception.

File names follow ``torch.profiler.tensorboard_trace_handler``'s layout, ``<worker>.<timestamp_ms>.pt.trace.json``,
so TensorBoard, Perfetto and chrome://tracing open the run directory as it is. Each file is exported under a
hidden temporary name and renamed into place, so a reader never finds a half-written trace.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from torchscope.capture.notices import describe, log
from torchscope.capture.thinning import thin_trace
from torchscope.rundir.layout import trace_name


class TraceWriter:
    """Callable given to ``torch.profiler.profile(on_trace_ready=...)``.

    Problems (disk full, permission denied, directory removed) go to ``on_error`` as one line and the
    training goes on: an exception here would surface in the user's ``prof.step()``.
    """

    def __init__(self, run_dir: Path, worker: str, on_error: Callable[[str], None], budget_bytes: int = 0) -> None:
        self.run_dir = run_dir
        self.budget_bytes = budget_bytes  # a larger trace is thinned (capture/thinning.py); 0: no bound
        self.worker = worker
        self.files: list[str] = []  # names relative to run_dir, in the order written
        self.backend: str | None = None  # torch.distributed's, seen while tracing (for the manifest)
        self._on_error = on_error

    def __call__(self, prof: Any) -> None:
        tmp: Path | None = None
        self.backend = current_backend() or self.backend
        try:
            started = time.perf_counter()
            name = self._free_name()
            tmp = self.run_dir / f".{name}.partial"
            prof.export_chrome_trace(str(tmp))
            self._bound(tmp)
            os.replace(tmp, self.run_dir / name)
            self.files.append(name)
            log.debug("wrote %s in %.2f s", name, time.perf_counter() - started)
        except Exception as exc:
            if tmp is not None:
                _remove_partials(tmp)
            self._on_error(f"could not write a trace file in {self.run_dir}: {describe(exc)}")

    def _bound(self, tmp: Path) -> None:
        """Thin the exported trace to its budget; if that fails, keep it whole and say why."""
        try:
            summary = thin_trace(tmp, self.budget_bytes)
        except Exception as exc:  # a trace too big to re-read must not cost the trace itself
            self._on_error(f"could not bound the trace to {self.budget_bytes >> 20} MiB: {describe(exc)}; kept whole")
            return
        if summary is not None:
            log.debug("dropped %d of %d Python-function events to fit %d MiB",
                      summary["python_events_dropped"], summary["python_events"], self.budget_bytes >> 20)

    def _free_name(self) -> str:
        # Milliseconds as in the documented layout; two cycles ending in one millisecond take the next one.
        stamp_ms = int(time.time() * 1000)
        while self._taken(trace_name(self.worker, stamp_ms)):
            stamp_ms += 1
        return trace_name(self.worker, stamp_ms)

    def _taken(self, name: str) -> bool:
        return name in self.files or (self.run_dir / name).exists()


def current_backend() -> str | None:
    """The initialised default process group's backend (``gloo``, ``nccl``), else None. Asked while tracing:
    by the time the manifest is written the script may have destroyed its process group."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:  # a half-initialised or torn-down group: no backend to report
        return None
    return None


def _remove_partials(tmp: Path) -> None:
    """Remove the temporary export and whatever the exporter made beside it (Kineto writes ``<tmp>.tmp``
    first), so a failed export (disk full) leaves no file behind."""
    for path in (tmp, tmp.with_name(tmp.name + ".tmp")):
        try:
            path.unlink()
        except OSError:
            pass
    try:
        for entry in tmp.parent.iterdir():
            if entry.name.startswith(tmp.name):
                entry.unlink()
    except OSError:
        pass
