"""Training steps and evaluation steps of one trace file.

Lightning's `PyTorchProfiler` steps the profiler in `validation_step` (and `test_step`, `predict_step`) too:
those steps run forward passes only, and mixed into the training steps they pull every per-step figure (the
mean step, its spread, each phase's share) toward a step that is not one. A step is left out as evaluation
on positive evidence only: no backward or optimizer event reaches its window (their ranges, the autograd
engine's ops, torch.optim's frames: `markers.named_phase_masks`), and an evaluation action range starts in it
(Lightning's `[pl][profile]...validation_step`, `...test_step`, `...predict_step`), in a file where other
steps train. A step with neither evidence is kept: a forward whose loss is summed with the next one's before
one backward (steps training every other step), or an RL rollout, is training's cost. The steps left out
are counted apart (`StepWindows.evaluation_steps`, `evaluation_us`); a file none of whose steps train keeps
them all. Lightning steps the profiler when `training_step` returns, inside the optimizer's closure, so the
window of the first validation batch after a training batch holds that batch's backward and optimizer step:
it is kept, validation and all.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import HOST_RANGES, LIGHTNING_PREFIX, named_phase_masks
from torchscope.analysis.steps import StepWindows
from torchscope.trace.tables import EventTable


def training_steps(events: EventTable, steps: StepWindows) -> StepWindows:
    """`steps` without its evaluation steps (see the module docstring), which it counts."""
    if steps.source == "whole_trace" or len(steps) < 2:
        return steps
    named = named_phase_masks(events)
    rows = np.flatnonzero(named["backward"] | named["optimizer"])
    evaluating = np.flatnonzero(evaluation_action_mask(events))
    if rows.size == 0 or evaluating.size == 0:
        return steps
    start = events.ts_us[rows]
    trains = intervals.overlap_per_window(intervals.union(start, start + events.dur_us[rows]), steps.start_us, steps.end_us) > 0
    inside = steps.index_of(start)
    trains[inside[inside >= 0]] = True  # an event of no duration still says so
    evaluates = np.zeros(len(steps), dtype=bool)
    at = steps.index_of(events.ts_us[evaluating])
    evaluates[at[at >= 0]] = True
    evaluation = evaluates & ~trains
    if not evaluation.any() or not trains.any():
        return steps
    trains = ~evaluation
    return msgspec.structs.replace(
        steps,
        number=steps.number[trains],
        start_us=steps.start_us[trains],
        end_us=steps.end_us[trains],
        evaluation_steps=int(evaluation.sum()),
        evaluation_us=float(np.maximum(steps.duration_us[evaluation], 0.0).sum()),  # a damaged trace's may be < 0
    )


_EVALUATION_ACTIONS = (".validation_step", ".test_step", ".predict_step")


def _is_evaluation_action(name: str) -> bool:
    return name.startswith(LIGHTNING_PREFIX) and name.endswith(_EVALUATION_ACTIONS)


def evaluation_action_mask(events: EventTable) -> np.ndarray:
    """The ranges that say a step evaluates: Lightning's evaluation actions (named predicate: its answers
    are kept per table)."""
    return events.name_mask(_is_evaluation_action) & events.kind_mask(HOST_RANGES)
