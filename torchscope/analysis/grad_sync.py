"""Gradient accumulation under data parallelism: forward passes per step, and how many of their backward
passes synchronised the gradients.

With gradient accumulation a step runs N forward and backward passes and one optimizer step. DDP (and
FSDP) all-reduce (reduce-scatter) the gradients in every backward pass unless the first N-1 run under
`model.no_sync()`: then N-1 of the N synchronisations are wasted, each the full gradient volume. The trace
shows it as gradient collectives launched inside the backward of more than one micro-step: the
collectives' dispatcher ops (`c10d::allreduce_`, or the backend's or NCCL's own ranges) starting inside a
backward range (DDP launches them from its autograd hooks, inside
`autograd::engine::evaluate_function: ...AccumulateGrad`), counted per window between one forward start
and the next. A logging all-reduce of the loss runs outside the backward and is not counted.

Micro-steps are the outermost DDP or FSDP forward ranges (`DistributedDataParallel.forward`,
`FullyShardedDataParallel.forward`), else torchscope's forward labels. The time: the gradient
collectives' wall time in the step (the timed events of analysis/collectives.py), and the part of it not
overlapped by compute; N-1 of N syncs are that time's redundant part.
"""

from __future__ import annotations

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.collectives import collective_name, compute_set, timed_events
from torchscope.analysis.markers import HOST_RANGES, is_comm_op_name, phase_masks
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids
from torchscope.report.measurements import GradientSync
from torchscope.rundir.labels import PHASE_LABELS
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")
_WRAPPERS = {"DistributedDataParallel.forward": "DistributedDataParallel", "FullyShardedDataParallel.forward": "FullyShardedDataParallel"}


def _is_wrapper_forward(name: str) -> bool:
    return name in _WRAPPERS


def _is_forward_label(name: str) -> bool:
    return name == PHASE_LABELS["forward"]


def _is_fsdp2_range(name: str) -> bool:
    return name.startswith("FSDP::")


def _is_gradient_collective(name: str) -> bool:
    return is_comm_op_name(name) and name != "record_param_comms" and collective_name(name) in GRADIENT_COLLECTIVES


def gradient_sync(span: SpanInput) -> GradientSync | None:
    """Micro-steps and gradient synchronisations per step (None: no step with two forward passes)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    forwards, wrapper = _forward_passes(events)
    step_of_forward = steps.index_of(forwards)
    inside = step_of_forward >= 0
    forwards, step_of_forward = forwards[inside], step_of_forward[inside]
    micro_steps = np.bincount(step_of_forward, minlength=len(steps))
    if micro_steps.max(initial=0) < 2:
        return None
    launches = _gradient_launches(events)
    step_of_launch = steps.index_of(launches)
    # The micro-step (forward window) each launch falls in: forward starts are sorted, and a launch before
    # its step's first forward (none in practice) is left out.
    window = np.searchsorted(forwards, launches, side="right") - 1
    counted = (step_of_launch >= 0) & (window >= 0)
    counted[counted] &= step_of_forward[window[counted]] == step_of_launch[counted]
    windows = np.unique(window[counted])
    syncing = np.bincount(step_of_forward[windows], minlength=len(steps))
    wall, exposed = _collective_time(span)
    redundant = np.where(syncing > 1, (syncing - 1) / np.maximum(syncing, 1), 0.0)
    return GradientSync(
        wrapper=wrapper,
        micro_steps_per_step=float(micro_steps.mean()),
        syncing_micro_steps_per_step=float(syncing.mean()),
        sync_us_per_step=float(wall.mean()),
        sync_exposed_us_per_step=float(exposed.mean()),
        redundant_sync_us_per_step=float((wall * redundant).mean()),
        redundant_exposed_us_per_step=float((exposed * redundant).mean()),
    )


def _forward_passes(events: EventTable) -> tuple[np.ndarray, str]:
    """The start of each forward pass (sorted), and the data-parallel wrapper that marks them."""
    host = events.kind_rows(HOST_RANGES)
    wrapped = host[events.name_mask(_is_wrapper_forward, host)]
    if wrapped.size:
        # Nested FSDP instances each record the range: one pass is their union.
        starts, _ = intervals.union(events.ts_us[wrapped], events.ts_us[wrapped] + events.dur_us[wrapped])
        names, _ = group_ids(events.name[wrapped])
        return starts, _WRAPPERS[events.strings[int(names[0])]]
    labels = events.kind_rows(Kind.USER_ANNOTATION)
    labels = labels[events.name_mask(_is_forward_label, labels)]
    wrapper = "fully_shard" if events.name_mask(_is_fsdp2_range, host).any() else ""
    starts, _ = intervals.union(events.ts_us[labels], events.ts_us[labels] + events.dur_us[labels])
    return starts, wrapper


def _gradient_launches(events: EventTable) -> np.ndarray:
    """Start times of the host's gradient collectives launched inside a backward range."""
    host = events.kind_rows(HOST_RANGES)
    rows = host[events.name_mask(_is_gradient_collective, host)]
    backward = np.flatnonzero(phase_masks(events)["backward"])
    ranges = intervals.union(events.ts_us[backward], events.ts_us[backward] + events.dur_us[backward])
    ts = events.ts_us[rows]
    return np.sort(ts[intervals.contains(ranges, ts)])


def _collective_time(span: SpanInput) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the gradient collectives' wall time (their timed events' union) and its part not overlapped
    by compute."""
    events, steps = span.events, span.steps
    _, rows = timed_events(events)
    wall = np.zeros(len(steps))
    exposed = np.zeros(len(steps))
    if rows.size == 0:
        return wall, exposed
    raw = np.where(events.comm_name[rows] > 0, events.comm_name[rows], events.name[rows])
    names, slot = group_ids(raw)
    wanted = np.array([collective_name(events.strings[int(i)]) in GRADIENT_COLLECTIVES for i in names.tolist()])[slot]
    rows = rows[wanted]
    collectives = intervals.union(events.ts_us[rows], events.ts_us[rows] + events.dur_us[rows])
    alone = intervals.subtract(collectives, compute_set(span))
    wall = intervals.overlap_per_window(collectives, steps.start_us, steps.end_us)
    exposed = intervals.overlap_per_window(alone, steps.start_us, steps.end_us)
    return wall, exposed
