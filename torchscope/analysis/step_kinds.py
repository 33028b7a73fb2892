"""Training steps and evaluation steps of one trace file.

Lightning's `PyTorchProfiler` steps the profiler in `validation_step` too, and a hand-written loop may call
`prof.step()` in its evaluation loop: those steps run forward passes only. Mixed into the training steps
they pull every per-step figure (the mean step, its spread, each phase's share) toward a step that is not
one. A step window that no backward or optimizer event reaches (their ranges, the autograd engine's ops,
torch.optim's frames: `markers.named_phase_masks`), in a trace file where other steps hold them, is an
evaluation step: it is left out of the step windows the analyses read and counted apart
(`StepWindows.evaluation_steps`, `evaluation_us`). A file none of whose steps train (an inference trace, a
validation-only cycle) keeps them all.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import named_phase_masks
from torchscope.analysis.steps import StepWindows
from torchscope.trace.tables import EventTable


def training_steps(events: EventTable, steps: StepWindows) -> StepWindows:
    """`steps` without its evaluation steps (see the module docstring), which it counts."""
    if steps.source == "whole_trace" or len(steps) < 2:
        return steps
    named = named_phase_masks(events)
    rows = np.flatnonzero(named["backward"] | named["optimizer"])
    if rows.size == 0:
        return steps
    start = events.ts_us[rows]
    trains = intervals.overlap_per_window(intervals.union(start, start + events.dur_us[rows]), steps.start_us, steps.end_us) > 0
    inside = steps.index_of(start)
    trains[inside[inside >= 0]] = True  # an event of no duration still says so
    if trains.all() or not trains.any():
        return steps
    evaluation = ~trains
    return msgspec.structs.replace(
        steps,
        number=steps.number[trains],
        start_us=steps.start_us[trains],
        end_us=steps.end_us[trains],
        evaluation_steps=int(evaluation.sum()),
        evaluation_us=float(np.maximum(steps.duration_us[evaluation], 0.0).sum()),  # a damaged trace's may be < 0
    )
