"""What a capture records: the ``torch.profiler`` schedule and options, with their defaults.

:class:`CaptureConfig` is the one place these defaults live: ``torchscope.profile()`` takes its fields as
keywords, ``torchscope run`` makes one command-line option per field, and the manifest records the schedule
and options from it (docs/capture.md says why each default is what it is).
"""

from __future__ import annotations

import os

import msgspec

from torchscope.errors import CaptureError

# The fields of the torch.profiler schedule, each with its smallest value (a cycle records at least one step).
SCHEDULE_MINIMUM = {"skip_first": 0, "wait": 0, "warmup": 0, "active": 1, "repeat": 0}
SCHEDULE_FIELDS = tuple(SCHEDULE_MINIMUM)


class CaptureConfig(msgspec.Struct, frozen=True):
    """Where the run directory goes and what ``torch.profiler`` records.

    The default schedule records steps 2-4: step 0 (lazy initialisation, allocator growth) is skipped and
    step 1 warms the profiler up. ``repeat`` cycles write one trace file each (0: until the end).
    Shapes, memory, stacks and FLOPs are all on: they are what let a finding name the culprit.
    ``stop_after_active`` ends the script once the last active window is saved.
    """

    out: str | os.PathLike[str] = "runs"
    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    with_flops: bool = True
    phase_labels: bool = True
    stop_after_active: bool = False
    memory_snapshot: bool = False  # CUDA allocator history and snapshot (capture/memory_snapshot.py)
    # Largest trace file, in MiB: a bigger one loses its shortest Python-function events (capture/thinning.py)
    # and says so. 100: a Python-heavy pipeline's 3 steps made 155-278 MB, nearly all Python calls; a trace
    # of this size still loads and analyses in seconds. 0: no bound.
    trace_budget_mb: int = 100

    def __post_init__(self) -> None:
        wrong = [f"{name} must be >= {low}" for name, low in SCHEDULE_MINIMUM.items() if getattr(self, name) < low]
        if self.trace_budget_mb < 0:
            raise CaptureError(f"invalid trace budget: {self.trace_budget_mb} MiB (must be >= 0; 0: no bound)")
        if wrong:
            schedule = " ".join(f"{name}={getattr(self, name)}" for name in SCHEDULE_FIELDS)
            raise CaptureError(f"invalid schedule: {schedule} ({', '.join(wrong)})")
