"""Per-step time breakdown: every instant of a step attributed to exactly one category.

Categories are taken in priority order and each one only gets the time not already taken by the ones
before it, so per-step parts add up to the step duration ("other" is what no category covers).

* Traces with device activity use the TensorBoard plugin's Overview order: kernel > memcpy > memset >
  communication > runtime > data_loading > cpu_exec > other. "data_loading" is therefore the data-loading
  time *not hidden* behind device work. (Unlike the plugin, NCCL kernels count as communication by name
  too, and torchscope's own phase labels and ProfilerStep ranges are not CPU work.)
* CPU-only traces (and the `phases` split of device traces) use the host phases: communication >
  data_loading > optimizer > backward > forward > other.

Closure-based steps (`optimizer.step(closure)`: LBFGS, Lightning) run forward and backward *inside* torch's
`Optimizer.step#...` range. The optimizer's time is that range less the closures, backward and forward
nested in it (optimizer ranges inside them, e.g. a `zero_grad` in the closure, stay the optimizer's); what
a closure runs outside forward and backward (the loss, the training-step code) counts as forward.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import is_module_call
from torchscope.analysis.markers import HOST_RANGES, LABEL_PREFIX, closure_mask, comm_kernel_mask, is_backward_name, name_mask, phase_masks
from torchscope.analysis.steps import StepWindows, main_thread_mask, step_marker_mask
from torchscope.arrays import distinct, group_ids
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

DEVICE_CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "data_loading", "cpu_exec", "other")
PHASE_PRIORITY = ("communication", "data_loading", "optimizer", "backward", "forward")
PHASE_CATEGORIES = ("data_loading", "forward", "backward", "optimizer", "communication", "other")


class StepBreakdown(msgspec.Struct, frozen=True):
    """Microseconds per (step, category); rows follow the step windows, columns `categories`."""

    categories: tuple[str, ...]
    per_step_us: np.ndarray


def _set(events: EventTable, which: np.ndarray) -> intervals.IntervalSet:
    """The time covered by the events of a mask (or of rows, ascending)."""
    rows = np.flatnonzero(which) if which.dtype == bool else which  # one pass over a mask, not one per column
    start = events.ts_us[rows]
    return intervals.union(start, start + events.dur_us[rows])


def _without(rows: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """`rows` less those in the mask `excluded`."""
    return rows[~excluded[rows]]


def _is_own_label(name: str) -> bool:
    return name.startswith(LABEL_PREFIX)


def _partition(sets: list[intervals.IntervalSet], steps: StepWindows) -> np.ndarray:
    windows = intervals.union(steps.start_us, steps.end_us)
    parts = intervals.priority_partition(sets, windows)
    return _per_step(parts, steps)


def _per_step(parts: list[intervals.IntervalSet], steps: StepWindows) -> np.ndarray:
    """Each part's time inside each step: one row per step, one column per part."""
    return np.stack([intervals.overlap_per_window(p, steps.start_us, steps.end_us) for p in parts], axis=1)


def device_breakdown(events: EventTable, steps: StepWindows) -> StepBreakdown:
    comm_kernels = comm_kernel_mask(events)
    phases = phase_masks(events)
    cpu_exec = _without(_without(events.kind_rows(HOST_RANGES), step_marker_mask(events)), events.name_mask(_is_own_label))
    sets = [
        _set(events, _without(events.kind_rows(Kind.KERNEL), comm_kernels)),
        _set(events, events.kind_rows(Kind.MEMCPY)),
        _set(events, events.kind_rows(Kind.MEMSET)),
        _set(events, comm_kernels | phases["communication"]),
        _set(events, events.kind_rows((Kind.RUNTIME, Kind.DRIVER))),
        _set(events, phases["data_loading"]),
        _set(events, cpu_exec),
    ]
    return StepBreakdown(DEVICE_CATEGORIES, _partition(sets, steps))


def phase_partition(
    events: EventTable, steps: StepWindows
) -> tuple[StepBreakdown, dict[str, intervals.IntervalSet]]:
    """Host-phase breakdown, plus the time attributed to each phase as interval sets (incl. "other")."""
    masks = phase_masks(events)
    sets = {name: _set(events, masks[name]) for name in PHASE_PRIORITY}
    sets["backward"] = _merge(sets["backward"], _set(events, _engine_thread_ops(events, masks)))
    closures = _set(events, closure_mask(events))
    # Without forward markers the forward is inferred first: a closure's forward inside `Optimizer.step`
    # (Lightning, LBFGS) is then the forward's, not the optimizer's.
    implicit = None if masks["forward"].any() else _implicit_forward(events, steps, sets["backward"], masks["optimizer"])
    nested = _merge(closures, sets["backward"], sets["forward"] if implicit is None else implicit)
    # Not stretched to the next backward as the labelled forwards are (to hold the loss): work between a
    # teacher's call and the training forward (augmentation) is no forward.
    unlabelled = _unlabelled_forwards(events, steps, sets) if implicit is None else intervals.EMPTY
    sets["optimizer"] = _optimizer_outside(events, masks["optimizer"], nested)
    sets["forward"] = _merge(_forward_through_loss(sets, steps) if implicit is None else implicit, closures, unlabelled)
    windows = intervals.union(steps.start_us, steps.end_us)
    parts = intervals.priority_partition([sets[name] for name in PHASE_PRIORITY], windows)
    per_priority = _per_step(parts, steps)
    order = [PHASE_PRIORITY.index(c) if c != "other" else len(PHASE_PRIORITY) for c in PHASE_CATEGORIES]
    named = dict(zip((*PHASE_PRIORITY, "other"), parts))
    return StepBreakdown(PHASE_CATEGORIES, per_priority[:, order]), named


def _merge(*sets: intervals.IntervalSet) -> intervals.IntervalSet:
    return intervals.union(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def _optimizer_outside(events: EventTable, optimizer: np.ndarray, nested: intervals.IntervalSet) -> intervals.IntervalSet:
    """Optimizer ranges less the closures/backward/forward they hold; ranges that start inside those
    (a ``zero_grad`` in a closure) are kept whole."""
    if nested[0].size == 0:
        return _set(events, optimizer)
    rows = np.flatnonzero(optimizer)
    inner = np.zeros_like(optimizer)
    inner[rows] = intervals.contains(nested, events.ts_us[rows])
    outer = intervals.subtract(_set(events, optimizer & ~inner), nested)
    return _merge(outer, _set(events, inner))


def _forward_through_loss(sets: dict[str, intervals.IntervalSet], steps: StepWindows) -> intervals.IntervalSet:
    """Extend each forward range to the next backward start in its step: the loss is computed between
    the model's forward and `loss.backward()`, outside any module, and belongs to the forward pass.
    Phases of higher priority in between (zero_grad, data loading) keep their own time."""
    fwd_start, fwd_end = sets["forward"]
    bwd_start = sets["backward"][0]
    if fwd_start.size == 0 or bwd_start.size == 0 or len(steps) == 0:
        return sets["forward"]
    step = steps.index_of(fwd_start)
    step_end = np.where(step >= 0, steps.end_us[np.maximum(step, 0)], -np.inf)
    following = np.searchsorted(bwd_start, fwd_end, side="left")
    next_backward = bwd_start[np.minimum(following, bwd_start.size - 1)]
    extend = (following < bwd_start.size) & (next_backward < step_end)
    return intervals.union(fwd_start, np.where(extend, next_backward, fwd_end))


def _unlabelled_forwards(events: EventTable, steps: StepWindows, sets: dict[str, intervals.IntervalSet]) -> intervals.IntervalSet:
    """Calls of a model the run does not train, without gradients, in every step: a frozen backbone, a
    teacher. Once a run has trained, torchscope's hooks give a call without gradients no forward label (at
    capture it cannot be told from validation: capture/phases.py, `NO_GRAD_FORWARD`); a linear probe's
    backbone then read as 56 % of the step "outside the phases", with advice to run it every N steps. Such a
    call usually feeds the loss: it is taken as the forward, wherever it falls in the step (without a
    DataLoader, a call at the start of an iteration lands in the step before, whose boundary waits for
    autograd). The trained model's own calls without gradients (validation, metrics, an RL rollout; any
    module also called inside a phase range) and calls in some steps only (validation every N steps) stay
    outside the phases. By module name, not data flow (the trace has none): an EMA copy evaluated every step
    for a metric reads as forward, pseudo-labels from the trained model (FixMatch) as outside the phases.
    Needs stacks (the `nn.Module:` frames)."""
    calls = np.flatnonzero(events.name_mask(is_module_call) & events.kind_mask(Kind.PYTHON_FUNCTION) & main_thread_mask(events))
    if calls.size == 0 or sets["backward"][0].size == 0 or len(steps) == 0:
        return intervals.EMPTY
    start = events.ts_us[calls]
    step = steps.index_of(start)
    # A call overlapping a phase range is the trained model's (its forward's call opens just before its label).
    labelled = _merge(*(sets[name] for name in PHASE_PRIORITY))
    trained = intervals.overlap_per_window(labelled, start, start + events.dur_us[calls]) > 0
    names, group = group_ids(events.name[calls])
    of_trained = np.bincount(group[trained], minlength=names.size) > 0
    keep = (step >= 0) & ~trained & ~of_trained[group]
    calls, step, group = calls[keep], step[keep], group[keep]
    if calls.size == 0:
        return intervals.EMPTY
    pairs = distinct(group.astype(np.int64) * len(steps) + step)
    in_steps = np.bincount(pairs // len(steps), minlength=names.size)
    return _set(events, calls[in_steps[group] == len(steps)])


def _first_backward_start(backward: intervals.IntervalSet, steps: StepWindows) -> np.ndarray:
    """Per step, the start of its first backward range (inf: none in the step)."""
    first = np.full(len(steps), np.inf)
    b = np.searchsorted(backward[0], steps.start_us, side="left")
    start = backward[0][np.minimum(b, backward[0].size - 1)]
    has = (b < backward[0].size) & (start < steps.end_us)
    first[has] = start[has]
    return first


def _engine_thread_ops(events: EventTable, masks: dict[str, np.ndarray]) -> np.ndarray:
    """The CPU ops of the autograd engine's own threads: threads other than the training loop's that run
    autograd nodes (on a GPU the engine runs the backward on a device thread; on a CPU on the caller's) and
    no forward or optimizer range. Besides its `evaluate_function` ranges it runs ops of its own between
    them (gradient accumulation's `aten::add`, 0.5 ms a step in the ResNet-50 sample), backward work that
    no backward range holds."""
    loop = main_thread_mask(events)
    nodes = np.flatnonzero(name_mask(events, is_backward_name, HOST_RANGES) & ~loop)
    ops = np.zeros(len(events), dtype=bool)
    for key in distinct(events.thread_keys(nodes)).tolist():  # one or two threads (one per device)
        rows = events.thread_rows(key)
        if not (masks["forward"][rows].any() or masks["optimizer"][rows].any()):
            ops[rows] = True
    return ops & (events.kind == Kind.CPU_OP)


def _implicit_forward(
    events: EventTable, steps: StepWindows, backward: intervals.IntervalSet, optimizer: np.ndarray
) -> intervals.IntervalSet:
    """Without forward markers: the step's CPU ops that start before its first backward op, and those of the
    training loop's model calls (or, without stacks, its ops) before its last backward op, through to the next
    backward (all of them when the step has no backward, e.g. inference). Before the last too: with gradient
    accumulation each micro-batch's forward follows the previous one's backward, and a trace without step
    markers is one window holding every iteration (`_later_forwards`).
    Backward ops themselves go to backward (it comes first). Ops inside an optimizer range are the
    optimizer's (`zero_grad`, the update), unless a backward runs inside that range: then it is
    `Optimizer.step(closure)`, whose closure's forward comes before that backward."""
    if len(steps) == 0:  # every step was cut off (steps.find_steps): no step to hold a forward
        return intervals.EMPTY
    ops = np.flatnonzero(events.kind == Kind.CPU_OP)
    ops = ops[~step_marker_mask(events)[ops]]
    ts = events.ts_us[ops]
    step = steps.index_of(ts)
    inside = step >= 0
    first_backward, last_backward = np.full(len(steps), np.inf), np.full(len(steps), np.inf)
    if backward[0].size:
        first_backward = _first_backward_start(backward, steps)
        b = np.searchsorted(backward[0], steps.end_us, side="left") - 1  # the last backward start before its end
        start = backward[0][np.maximum(b, 0)]
        has = (b >= 0) & (start >= steps.start_us)
        last_backward[has] = start[has]
    at = np.maximum(step, 0)
    forward = _set(events, ops[inside & (ts < first_backward[at])])
    between = inside & (ts >= first_backward[at]) & (ts < last_backward[at])
    later = _later_forwards(events, steps, backward, ops[between], first_backward, last_backward)
    return intervals.subtract(_merge(forward, later), _optimizer_without_backward(events, optimizer, backward))


def _later_forwards(
    events: EventTable, steps: StepWindows, backward: intervals.IntervalSet, between: np.ndarray,
    first_backward: np.ndarray, last_backward: np.ndarray,
) -> intervals.IntervalSet:
    """The forwards between a step's first and last backward start (`between`: the ops there). With stacks
    recorded, the model's calls (`nn.Module:` frames of the loop's thread) there, and before the first
    backward the call that leads into it (no other call starts between its end and that backward), each up
    to the next backward start (the loss between): the training forward's Python between its ops is the
    forward's too (a Hugging Face Trainer's `compute_loss` was named as work outside the phases). An earlier
    call before the first backward (a teacher, a rollout, validation) keeps only its ops as forward, and
    what else the loop runs (a reward in Python, metrics, clipping, an update by hand) stays outside the
    phases. Without stacks, the loop thread's ops."""
    loop = main_thread_mask(events)
    calls = np.flatnonzero(name_mask(events, is_module_call, (Kind.PYTHON_FUNCTION,)) & loop)
    if calls.size == 0:
        return _set(events, between[loop[between]])
    start = events.ts_us[calls]
    step = steps.index_of(start)
    at = np.maximum(step, 0)
    keep = (step >= 0) & (start < last_backward[at])
    before_first = keep & (start < first_backward[at])
    # Another call starting after this one ends and before the first backward: this one is no training forward.
    starts = np.sort(start)
    end = start + events.dur_us[calls]
    followed = np.searchsorted(starts, end, side="right") < np.searchsorted(starts, first_backward[at], side="left")
    return _forward_through_loss({"forward": _set(events, calls[keep & ~(before_first & followed)]), "backward": backward}, steps)


def _optimizer_without_backward(events: EventTable, optimizer: np.ndarray, backward: intervals.IntervalSet) -> intervals.IntervalSet:
    """The time of the optimizer ranges that hold no backward start: an update or a `zero_grad`, not a step
    running a closure."""
    rows = np.flatnonzero(optimizer)
    start = events.ts_us[rows]
    end = start + events.dur_us[rows]
    held = np.searchsorted(backward[0], end, side="left") - np.searchsorted(backward[0], start, side="left")
    return intervals.union(start[held == 0], end[held == 0])
