"""Gradient accumulation under data parallelism: forward passes per step, and how many of their backward
passes synchronised the gradients where one synchronisation would do.

With gradient accumulation a step runs N forward and backward passes and one optimizer step. DDP (and
FSDP) all-reduce (reduce-scatter) the gradients in every backward pass unless the first N-1 run under
`model.no_sync()`: then N-1 of the N synchronisations are wasted, each the full gradient volume.

* Micro-steps: the forward passes, from the outermost `DistributedDataParallel.forward` /
  `FullyShardedDataParallel.forward` ranges (nested FSDP instances merged), FSDP2's
  `FSDP::root_pre_forward`, else torchscope's forward labels; a forward range that starts inside a
  backward range is a recomputation (activation checkpointing), not a micro-step.
* Gradient syncs: all-reduce and reduce-scatter dispatcher ops launched by the wrappers' gradient hooks,
  i.e. whose nearest enclosing range is AccumulateGrad's node (DDP's reducer hooks),
  `FullyShardedDataParallel._post_backward_hook` or `FSDP::post_backward_reduce`. A SyncBatchNorm's or a
  tensor-parallel layer's all-reduce inside its own backward node, and a logging all-reduce of the loss,
  are not gradient syncs.
* Redundant: a micro-step whose gradient syncs are followed, in the same step, by another micro-step's
  with no optimizer step in between (nothing read the synchronised gradients). A GAN's two DDP models,
  each synced once and stepped by its own optimizer, have none.
* Time: the collectives' timed events (analysis/collectives.py: NCCL kernels, backend ranges, ...) paired
  in order with their dispatcher ops when both lists are as long (else every all-reduce and reduce-scatter
  of the step counts as gradient sync); wall time, and the part not overlapped by compute.

The wrapper those forward ranges name is its own section too (`measurements.data_parallel`, with or
without accumulation): the communication rule's fixes depend on it.

DeepSpeed's ZeRO reduces gradients in every micro-step by design (`no_sync()` does not apply): traces
whose recorded stacks show DeepSpeed are left out. Pipeline stages each wrapped in their own DDP, with one
optimizer step at the end, would read as accumulation.
"""

from __future__ import annotations

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.collectives import collective_name, compute_set, timed_events
from torchscope.analysis.markers import HOST_RANGES, is_optimizer_name, phase_masks
from torchscope.analysis.nesting import nearest_ancestor_of
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import StepWindows
from torchscope.arrays import group_ids
from torchscope.report.measurements import DataParallel, GradientSync
from torchscope.rundir.labels import PHASE_LABELS
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")
_WRAPPERS = {
    "DistributedDataParallel.forward": "DistributedDataParallel",
    "FullyShardedDataParallel.forward": "FullyShardedDataParallel",
    "FSDP::root_pre_forward": "fully_shard",
}
# The ranges a data-parallel wrapper's gradient hooks run in: DDP's reducer hooks run after AccumulateGrad.
_SYNC_PARENTS = ("FullyShardedDataParallel._post_backward_hook", "FSDP::post_backward_reduce")


def _is_wrapper_forward(name: str) -> bool:
    return name in _WRAPPERS


def _is_forward_label(name: str) -> bool:
    return name == PHASE_LABELS["forward"]


def _is_sync_parent(name: str) -> bool:
    return name.endswith("torch::autograd::AccumulateGrad") or name.startswith(_SYNC_PARENTS)


def _is_deepspeed(name: str) -> bool:
    return "deepspeed/" in name


def _is_host_collective(name: str) -> bool:
    return name.startswith("c10d::") and collective_name(name) in GRADIENT_COLLECTIVES


def _is_optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#") or name == PHASE_LABELS["optimizer"]


def data_parallel(span: SpanInput) -> DataParallel | None:
    """The data-parallel wrapper whose forward ranges the trace records, and for FSDP the sharded units a
    forward pass all-gathers (None: no wrapper)."""
    events = span.events
    rows, wrapper = _forward_ranges(events)
    if not wrapper:
        return None
    units = 0.0
    if wrapper == "fully_shard" and rows.size <= max(len(span.steps), 1):
        # Each unit records `FSDP::pre_forward (fqn)` (a root without one) per pass. Several roots a step (blocks
        # sharded with no fully_shard(model), or micro-steps) leave the units per pass unknown: 0.
        host = events.kind_rows(HOST_RANGES)
        units = float(np.count_nonzero(events.name_mask(_is_fsdp2_unit_forward, host))) / rows.size
    elif wrapper == "FullyShardedDataParallel":  # nested units record the same range inside their parent's
        units = float(rows.size) / max(_ranges(events, rows)[0].size, 1)
    return DataParallel(wrapper=wrapper, units_per_forward=units)


def _is_fsdp2_unit_forward(name: str) -> bool:
    return name == "FSDP::pre_forward" or name.startswith("FSDP::pre_forward (")


def gradient_sync(span: SpanInput) -> GradientSync | None:
    """Micro-steps and gradient synchronisations per step (None: no step with two forward passes)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    rows, wrapper = _forward_ranges(events)
    if rows.size < 2:  # most traces: no accumulation to look at
        return None
    backward = _ranges(events, np.flatnonzero(phase_masks(events)["backward"]))
    rows = rows[~intervals.contains(backward, events.ts_us[rows])]  # a checkpointed block run again: no pass
    forwards, _ = _ranges(events, rows)  # nested FSDP instances each record the range: one pass is their union
    step_of_forward = steps.index_of(forwards)
    keep = step_of_forward >= 0
    forwards, step_of_forward = forwards[keep], step_of_forward[keep]
    micro_steps = np.bincount(step_of_forward, minlength=len(steps))
    if micro_steps.max(initial=0) < 2 or events.name_mask(_is_deepspeed, events.kind_rows(Kind.PYTHON_FUNCTION)).any():
        return None
    launches = _host_collectives(events)  # every c10d all-reduce / reduce-scatter, in time order
    gradient = _under_sync_hooks(span, launches)
    window = np.searchsorted(forwards, events.ts_us[launches], side="right") - 1
    step_of_launch = steps.index_of(events.ts_us[launches])
    counted = gradient & (step_of_launch >= 0) & (window >= 0)
    counted[counted] &= step_of_forward[window[counted]] == step_of_launch[counted]
    windows = np.unique(window[counted])
    syncing = np.bincount(step_of_forward[windows], minlength=len(steps))
    redundant_windows = _redundant(windows, step_of_forward, _first_last(window[counted], events.ts_us[launches[counted]]), _optimizer_starts(events))
    times = _collective_times(span, launches)
    in_redundant = counted & np.isin(window, redundant_windows)
    wall, exposed = _time_of(span, times, counted, steps)
    redundant_wall, redundant_exposed = _time_of(span, times, in_redundant, steps)
    all_wall, all_exposed = _time_of(span, times, None, steps)
    return GradientSync(
        wrapper=wrapper,
        micro_steps_per_step=float(micro_steps.mean()),
        syncing_micro_steps_per_step=float(syncing.mean()),
        redundant_micro_steps_per_step=float(redundant_windows.size / len(steps)),
        sync_us_per_step=float(wall.mean()),
        sync_exposed_us_per_step=float(exposed.mean()),
        redundant_sync_us_per_step=float(redundant_wall.mean()),
        redundant_exposed_us_per_step=float(redundant_exposed.mean()),
        collective_exposed_us_per_step=float(all_exposed.mean()),
    )


def _ranges(events: EventTable, rows: np.ndarray) -> intervals.IntervalSet:
    return intervals.union(events.ts_us[rows], events.ts_us[rows] + events.dur_us[rows])


def _forward_ranges(events: EventTable) -> tuple[np.ndarray, str]:
    """The rows of the forward ranges, and the data-parallel wrapper that records them (else torchscope's
    forward labels, wrapper "")."""
    host = events.kind_rows(HOST_RANGES)
    wrapped = host[events.name_mask(_is_wrapper_forward, host)]
    if wrapped.size:
        names, slot = group_ids(events.name[wrapped])
        counts = np.bincount(slot, minlength=names.size)
        return wrapped, _WRAPPERS[events.strings[int(names[np.argmax(counts)])]]
    labels = events.kind_rows(Kind.USER_ANNOTATION)
    return labels[events.name_mask(_is_forward_label, labels)], ""


def _host_collectives(events: EventTable) -> np.ndarray:
    """The c10d all-reduce and reduce-scatter ops on the host, in time order."""
    host = events.kind_rows(HOST_RANGES)
    rows = host[events.name_mask(_is_host_collective, host)]
    return rows[np.argsort(events.ts_us[rows], kind="stable")]


def _under_sync_hooks(span: SpanInput, rows: np.ndarray) -> np.ndarray:
    """Per row: whether its nearest enclosing range that is not itself a collective op is a wrapper's
    gradient hook (AccumulateGrad's node, FSDP's post-backward)."""
    events, tree = span.events, span.tree
    if rows.size == 0:
        return np.zeros(0, dtype=bool)
    ranges = events.kind_mask(HOST_RANGES)
    parents = np.maximum(tree.parent[rows], 0)
    # The nearest enclosing range (operators and annotations, not Python frames or other collectives).
    enclosing = nearest_ancestor_of(tree, ranges & ~events.name_mask(_is_host_collective))[parents]
    enclosing = np.where(tree.parent[rows] >= 0, enclosing, -1)
    hooked = np.zeros(rows.size, dtype=bool)
    has = enclosing >= 0
    hooked[has] = events.name_mask(_is_sync_parent, enclosing[has])
    return hooked


def _first_last(window: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per syncing window, in the order of `np.unique(window)`: its first and last gradient launch."""
    ids, slot = group_ids(window)
    first, last = np.full(ids.size, np.inf), np.full(ids.size, -np.inf)
    np.minimum.at(first, slot, ts)
    np.maximum.at(last, slot, ts)
    return first, last


def _optimizer_starts(events: EventTable) -> np.ndarray:
    host = events.kind_rows(HOST_RANGES)
    return np.sort(events.ts_us[host[events.name_mask(_is_optimizer_step, host)]])


def _redundant(windows: np.ndarray, step_of_forward: np.ndarray, bounds: tuple[np.ndarray, np.ndarray], optimizer: np.ndarray) -> np.ndarray:
    """The syncing windows (sorted, with their first and last launches) whose synchronised gradients were
    synchronised again, in the same step, before any optimizer step read them."""
    if windows.size < 2:
        return np.zeros(0, dtype=windows.dtype)
    first, last = bounds
    current, following = windows[:-1], windows[1:]
    same_step = step_of_forward[current] == step_of_forward[following]
    between = np.searchsorted(optimizer, first[1:], side="left") - np.searchsorted(optimizer, last[:-1], side="right")
    return current[same_step & (between <= 0)]


def _collective_times(span: SpanInput, launches: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """(start, end) of the timed event of each launch, in launch order, and whether they pair one to one
    (else: every timed all-reduce and reduce-scatter, unpaired)."""
    events = span.events
    source, rows = timed_events(events)
    if rows.size:
        raw = np.where(events.comm_name[rows] > 0, events.comm_name[rows], events.name[rows])
        names, slot = group_ids(raw)
        wanted = np.array([collective_name(events.strings[int(i)]) in GRADIENT_COLLECTIVES for i in names.tolist()])[slot]
        rows = rows[wanted]
        rows = rows[np.argsort(events.ts_us[rows], kind="stable")]
    start, end = events.ts_us[rows], events.ts_us[rows] + events.dur_us[rows]
    if source == "c10d":  # the dispatcher ops time themselves
        return events.ts_us[launches], events.ts_us[launches] + events.dur_us[launches], True
    return start, end, rows.size == launches.size


def _time_of(
    span: SpanInput, times: tuple[np.ndarray, np.ndarray, bool], chosen: np.ndarray | None, steps: StepWindows
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the wall time of the chosen launches' collectives (None: all of them) and its part not
    overlapped by compute."""
    start, end, paired = times
    scale = 1.0
    if chosen is not None and paired:
        start, end = start[chosen], end[chosen]
    elif chosen is not None:  # unpaired: the chosen launches' share of all of them
        scale = float(chosen.sum()) / max(chosen.size, 1)
    collectives = intervals.union(start, end)
    alone = intervals.subtract(collectives, compute_set(span))
    return (scale * intervals.overlap_per_window(collectives, steps.start_us, steps.end_us),
            scale * intervals.overlap_per_window(alone, steps.start_us, steps.end_us))
