"""`torchscope run --memory-snapshot`: record the CUDA caching allocator's history during the capture and
save a snapshot (`torch.cuda.memory._dump_snapshot`) beside the trace, for `torchscope memory` or
pytorch.org/memory_viz. CUDA only: on a machine without CUDA it says so once and records nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from torchscope.rundir.layout import memory_snapshot_name

MAX_ENTRIES = 100_000  # allocator actions kept (a ring buffer): a few KB each with stacks


class SnapshotRecorder:
    """Starts the allocator's history on `start()` and writes one snapshot on the first `save()`."""

    def __init__(self, torch: Any, on_problem: Callable[[str], None], notice: Callable[[str], None]) -> None:
        self._torch = torch
        self._problem = on_problem  # recorded in the manifest: a snapshot that failed
        self._notice = notice  # one line on stderr: nothing to record here
        self.recording = False
        self.path: Path | None = None

    def start(self) -> None:
        if not self._torch.cuda.is_available():
            self._notice("--memory-snapshot: no CUDA device, so no memory snapshot is recorded "
                          "(a snapshot is the CUDA caching allocator's state; the trace's memory events still are)")  # fmt: skip
            return
        self._torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
        self.recording = True

    def save(self, run_dir: Path, worker: str) -> Path | None:
        """Write the snapshot (atomically, via a hidden temporary file) and stop the history; once."""
        if not self.recording:
            return self.path
        self.recording = False
        target = run_dir / memory_snapshot_name(worker)
        temporary = run_dir / f".{target.name}.tmp"
        try:
            self._torch.cuda.memory._dump_snapshot(str(temporary))
            os.replace(temporary, target)
            self.path = target
        except Exception as exc:  # the training must never fail for a snapshot
            self._problem(f"--memory-snapshot: could not write {target.name}: {exc}")
            temporary.unlink(missing_ok=True)
        finally:
            self._torch.cuda.memory._record_memory_history(enabled=None)
        return self.path
