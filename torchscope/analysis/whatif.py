"""What a fix would save: a what-if replay of the step (documented in docs/analysis.md, "What-if savings").

GPU traces. The step is modelled as one host timeline feeding in-order device queues:

* the host: every host thread's events on one clock (the main thread waits for the autograd thread, so
  launches from either move together); a *cause* (data loading, the optimizer loop, ...) is a set of
  main-thread intervals, and shrinking it to a kept fraction moves every later host event earlier;
* launches: each device op (kernel, copy, memset) is tied to its runtime call by correlation id; it may
  start `lag` after its launch (the launch-to-start delay seen when its queue was empty) and not before
  the previous op of its stream ends (streams are in-order queues; cross-stream waits are not in the
  trace's events, so streams are otherwise independent);
* synchronisations (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, blocking `cudaMemcpy`, ...): the
  host resumes when every op launched before the sync has finished, or after the call's own fixed cost.

Replaying with the cause shrunk gives a new span time; the saving is the replayed baseline minus that
(both from the model, so its error on the baseline cancels). Each stream's queue is a max-plus scan,
`end_k = max(ready_k, end_{k-1}) + dur_k`, computed with cumulative sums and `np.maximum.accumulate`;
only the synchronisations are visited one by one (a few per step).

CPU traces: the main thread is the critical path (intra-op pools and loader workers only run while it
waits), so a cause's saving is its main-thread time, less what the fix keeps. Two causes keep the part
of their time the fix cannot remove, read from the trace rather than assumed:

* `optimizer_step`: foreach on a CPU removes the Python loop over parameters but not the per-tensor
  operators (CPU `_foreach_*` kernels run one operator per tensor: only CUDA has multi-tensor kernels),
  so the saving is the step's time covered by no operator (Python), less what foreach keeps of it, plus
  up to half the operators' time (dispatched from C++, below the autograd layer);
* `optimizer_step_fused` (CPU fused kernels: Adam/AdamW/SGD/Adagrad since PyTorch 2.4): one
  `_fused_*_` call per parameter group runs each tensor's whole update in one pass, so what stays is the
  per-parameter Python that gathers the tensors (`_init_group`), one tiny op per parameter (the step
  counters' `_foreach_add_`, per tensor on a CPU) and the arithmetic, in fewer passes over memory; the
  operators' arithmetic is the time of the leaves of at least `TINY_OP_US`, the rest their dispatch;
* `dispatch` (vectorise / torch.compile / larger batch): every operator's fixed cost and the Python
  between operators go, the arithmetic stays: forward/backward main-thread time less the leaf
  operators' time (low: every leaf kept; high: only leaves of at least `TINY_OP_US`, the real work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.host import TINY_OP_US, main_thread_mask, sync_mask
from torchscope.analysis.markers import HOST_RANGES, closure_mask, name_mask, phase_masks
from torchscope.analysis.nesting import launcher_of_device_events
from torchscope.analysis.span import SpanInput
from torchscope.arrays import median
from torchscope.report.measurements import Savings
from torchscope.trace.kinds import DEVICE_KINDS, kind_mask
from torchscope.trace.tables import EventTable

# Share of a cause's host time a fix keeps: (pessimistic, optimistic). Sources in docs/analysis.md.
KEPT: dict[str, tuple[float, float]] = {
    "data_loading": (0.25, 0.02),  # workers: the loop still takes the batch off a queue and collates
    "optimizer_step": (0.25, 0.05),  # foreach/fused: a few ops per update term instead of one per parameter
    "zero_grad": (0.2, 0.0),  # set_to_none: a loop over parameters remains
    "outside_steps": (0.1, 0.0),  # every N >= 10 steps (1/N kept) .. asynchronous, off the step path
    "launch": (0.6, 0.2),  # torch.compile / CUDA graphs: fewer, fused launches
    "sync": (0.25, 0.0),  # the sync moved out of the per-step path (one in four steps kept .. none)
}
# CPU: share of the Python time inside Optimizer.step a foreach optimizer keeps: half (Adam's
# _multi_tensor_adam still builds per-parameter lists in Python, bias corrections and step values; measured
# 40-54 % kept under the profiler, docs/rules.md) .. none (SGD's foreach has no per-parameter Python).
KEPT_CPU_OPTIMIZER_PYTHON = (0.5, 0.0)
# CPU: share of the operators' time inside Optimizer.step that foreach keeps: all .. half. Its per-tensor
# ops are dispatched from C++ below the autograd layer (no Python binding, no Autograd/ADInplaceOrView
# step): measured 34.2 -> 16.4 ms on a quiet VM, unchanged under load with one thread (docs/rules.md).
KEPT_CPU_OPTIMIZER_OPS = (1.0, 0.5)
# CPU fused optimizer (the rule advises it where torch and the optimizer class have a CPU kernel). Kept
# shares: of the Python, the per-parameter gathering in `_init_group` (measured 22-35 % of the for-loop's
# Python under the profiler on adam_foreach_false, docs/rules.md) .. less; of the operators' dispatch, the
# step counter's one tiny op per parameter against the loop's 3-4 (SGD with momentum) .. 8-9 (Adam); of
# their arithmetic, all (plain SGD: the loop already makes one pass) .. 20 % (Adam: 7 tensor reads and
# writes instead of ~19 over its ops, and no temporaries; its optimizer time on 8.4 M parameters kept
# 12-24 %, unprofiled and profiled, 1 and 2 threads, docs/rules.md).
KEPT_CPU_FUSED_PYTHON = (0.35, 0.15)
KEPT_CPU_FUSED_DISPATCH = (0.3, 0.1)
KEPT_CPU_FUSED_ARITHMETIC = (1.0, 0.2)
QUEUED_GAP_US = 2.0  # a device op starting this soon after its predecessor was waiting in the queue
SYNC_FIXED_US = 5.0  # a synchronisation call's own cost when nothing is left to wait for


@dataclass(frozen=True)
class DeviceQueue:
    """The span's device ops as the replay needs them (times from span start), grouped by the sync
    before which they are launched (`segment`), and within a segment by stream, then queue order: the
    order each replay scans them in, computed once per span rather than once per replay."""

    launch_us: np.ndarray
    lag_us: np.ndarray
    dur_us: np.ndarray
    stream: np.ndarray  # dense stream index
    bounds: np.ndarray  # ops of segment j are [bounds[j], bounds[j + 1]); one segment per sync, plus the tail
    last_of_stream: np.ndarray  # True where the next op is in another segment or stream


@dataclass(frozen=True)
class StepModel:
    """One span as a host timeline, device queues and synchronisations (times from span start)."""

    steps: int
    measured_us: float
    host_end_us: float
    queue: DeviceQueue
    sync_start_us: np.ndarray
    sync_end_us: np.ndarray


def _device_queue(events: EventTable, t0: float, t1: float, sync_start: np.ndarray) -> DeviceQueue:
    ops = np.flatnonzero(kind_mask(events.kind, DEVICE_KINDS))
    launcher = launcher_of_device_events(events, ops)
    start = events.ts_us[ops] - t0
    launch = np.where(launcher >= 0, events.ts_us[np.maximum(launcher, 0)] - t0, start)
    keep = (launch >= 0) & (launch < t1 - t0)
    ops, start, launch = ops[keep], start[keep], launch[keep]
    dur = events.dur_us[ops]
    _, stream = np.unique(events.stream[ops], return_inverse=True)
    stream = stream.astype(np.int64)
    by_stream = np.lexsort((start, stream))
    prev_end = np.full(ops.size, -np.inf)
    same = stream[by_stream][1:] == stream[by_stream][:-1]
    prev_end[by_stream[1:][same]] = (start + dur)[by_stream[:-1][same]]
    lag = np.maximum(start - launch, 0.0)
    waited_on_launch = start - prev_end > QUEUED_GAP_US  # the queue was empty: the lag is the launch delay
    typical = median(lag[waited_on_launch]) if waited_on_launch.any() else 0.0  # np.median imports numpy.ma
    lag = np.where(waited_on_launch, lag, np.minimum(lag, typical))
    # An op launched before sync j's start is replayed when the host reaches that sync.
    segment = np.searchsorted(sync_start, launch, side="right")
    order = np.lexsort((start, stream, segment))
    segment, stream = segment[order], stream[order]
    bounds = np.searchsorted(segment, np.arange(sync_start.size + 2), side="left")
    last = np.ones(order.size, dtype=bool)
    last[:-1] = (segment[1:] != segment[:-1]) | (stream[1:] != stream[:-1])
    return DeviceQueue(launch[order], lag[order], dur[order], stream, bounds, last)


def build_model(span: SpanInput) -> StepModel | None:
    """The replay model of a span with steps and device ops (None otherwise)."""
    steps, events = span.steps, span.events
    if len(steps) == 0 or not span.has_device:
        return None
    t0, t1 = float(steps.start_us[0]), float(steps.end_us[-1])
    main = main_thread_mask(events)
    host = main & kind_mask(events.kind, HOST_RANGES) & (events.ts_us >= t0) & (events.ts_us < t1)
    host_end = float(np.max(events.ts_us[host] + events.dur_us[host])) - t0 if host.any() else 0.0
    syncs = sync_mask(events) & (events.ts_us >= t0) & (events.ts_us < t1)
    order = np.argsort(events.ts_us[syncs], kind="stable")
    sync_start = events.ts_us[syncs][order] - t0
    return StepModel(
        steps=len(steps),
        measured_us=t1 - t0,
        host_end_us=host_end,
        queue=_device_queue(events, t0, t1, sync_start),
        sync_start_us=sync_start,
        sync_end_us=sync_start + events.dur_us[syncs][order],
    )


def _scan(ready: np.ndarray, dur: np.ndarray, stream: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """End times of in-order queues: end_k = max(ready_k, end_{k-1}) + dur_k per stream, each starting
    after `carry[stream]`; inputs sorted by stream then queue order."""
    first = np.ones(stream.size, dtype=bool)
    first[1:] = stream[1:] != stream[:-1]
    ready = np.where(first, np.maximum(ready, carry[stream]), ready)
    total = np.cumsum(dur)
    segment_base = np.maximum.accumulate(np.where(first, np.arange(stream.size), 0))
    before = total - dur  # cumulative duration before k, over all streams
    cum = total - before[segment_base]  # within the stream's segment, up to and including k
    value = ready - (cum - dur)
    # Segmented running max: lift each segment above all earlier ones, then take it back down.
    lift = np.cumsum(first) * (np.ptp(value) + 1.0 if value.size else 1.0)
    return cum + np.maximum.accumulate(value + lift) - lift


def replay(model: StepModel, removed: intervals.IntervalSet = intervals.EMPTY, kept: float = 1.0, blocking_syncs: bool = True) -> float:
    """The modelled span time with `removed` host time shrunk to `kept` of itself.

    A host time t moves to t - (1 - kept) * (removed time before t) + the delay accumulated at the
    syncs replayed so far; the device queues are replayed one segment (ops launched between two syncs)
    at a time, since each sync's wait depends on what is still queued."""
    q = model.queue
    shrink = 1.0 - kept
    ready = q.launch_us - shrink * intervals.covered_before(removed, q.launch_us) + q.lag_us
    sync_points = np.concatenate((model.sync_start_us, model.sync_end_us, [model.host_end_us]))
    moved = sync_points - shrink * intervals.covered_before(removed, sync_points)
    n_sync = model.sync_start_us.size
    carry = np.full(int(q.stream.max()) + 1 if q.stream.size else 1, -np.inf)
    extra = 0.0  # host delay (or advance) accumulated at the syncs replayed so far

    def advance(segment: int) -> None:
        part = slice(int(q.bounds[segment]), int(q.bounds[segment + 1]))
        if part.start == part.stop:
            return
        ends = _scan(ready[part] + extra, q.dur_us[part], q.stream[part], carry)
        last = q.last_of_stream[part]
        # Within a stream ends only grow, so each stream's last op holds its new carry.
        carry[q.stream[part][last]] = np.maximum(carry[q.stream[part][last]], ends[last])

    for j in range(n_sync):
        advance(j)
        begin = float(moved[j]) + extra
        fixed = min(float(model.sync_end_us[j] - model.sync_start_us[j]), SYNC_FIXED_US)
        resumed = max(begin + fixed, float(carry.max())) if blocking_syncs else begin + fixed
        extra += resumed - (float(moved[n_sync + j]) + extra)
    advance(n_sync)
    return float(max(float(moved[-1]) + extra, float(carry.max())))  # a Python float: extracts are msgpack-cached


def _main_set(span: SpanInput, mask: np.ndarray, allowed: intervals.IntervalSet, t0: float) -> intervals.IntervalSet:
    """Main-thread intervals of `mask`'s events within `allowed`, as times from `t0`."""
    events = span.events
    chosen = mask & main_thread_mask(events)
    start = events.ts_us[chosen]
    found = intervals.intersect(intervals.union(start, start + events.dur_us[chosen]), allowed)
    return found[0] - t0, found[1] - t0


def _less_closures(span: SpanInput, allowed: intervals.IntervalSet) -> intervals.IntervalSet:
    events = span.events
    phases = phase_masks(events)
    nested = closure_mask(events) | phases["forward"] | phases["backward"]
    start = events.ts_us[nested]
    return intervals.subtract(allowed, intervals.union(start, start + events.dur_us[nested]))


def cause_sets(span: SpanInput) -> dict[str, intervals.IntervalSet]:
    """Each modelled cause's main-thread intervals inside the steps, minus the syncs (which the replay
    treats as waits of their own), as times from the span's first step start."""
    events, steps, t0 = span.events, span.steps, float(span.steps.start_us[0])
    phases = phase_masks(events)
    syncs = sync_mask(events)
    sync_start = events.ts_us[syncs]
    allowed = intervals.subtract(intervals.union(steps.start_us, steps.end_us), intervals.union(sync_start, sync_start + events.dur_us[syncs]))

    def named(predicate: Callable[[str], bool]) -> np.ndarray:
        return name_mask(events, predicate, HOST_RANGES)

    host_ops = _main_set(span, kind_mask(events.kind, HOST_RANGES), allowed, 0.0)
    other_start, other_end = span.phase_sets["other"]
    outside = intervals.intersect((other_start, other_end), host_ops)
    compute = span.compute_set
    return {
        "data_loading": _main_set(span, phases["data_loading"], allowed, t0),
        # Less a closure's forward and backward (LBFGS, Lightning): they run inside the step range.
        "optimizer_step": _main_set(span, named(lambda s: s.startswith("Optimizer.step#")), _less_closures(span, allowed), t0),
        "zero_grad": _main_set(span, named(lambda s: s.startswith("Optimizer.zero_grad#")), allowed, t0),
        "outside_steps": (outside[0] - t0, outside[1] - t0),
        "launch": intervals.intersect((compute[0] - t0, compute[1] - t0), (host_ops[0] - t0, host_ops[1] - t0)),
    }


def _gpu_savings(span: SpanInput, model: StepModel) -> Savings:
    base = replay(model)
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    for cause, removed in cause_sets(span).items():
        if intervals.total_length(removed) <= 0:
            continue
        kept_low, kept_high = KEPT[cause]
        low[cause] = max(base - replay(model, removed, kept_low), 0.0) / model.steps
        high[cause] = max(base - replay(model, removed, kept_high), 0.0) / model.steps
    if model.sync_start_us.size:
        unblocked = max(base - replay(model, blocking_syncs=False), 0.0) / model.steps
        low["sync"], high["sync"] = unblocked * (1.0 - KEPT["sync"][0]), unblocked * (1.0 - KEPT["sync"][1])
    return Savings(
        model="device_replay",
        saved_us_per_step_low=low,
        saved_us_per_step_high=high,
        modelled_step_us=base / model.steps,
        measured_step_us=model.measured_us / model.steps,
    )


def _top_ops(span: SpanInput) -> np.ndarray:
    """Main-thread operators inside no other operator (a step range or label may enclose them)."""
    tree, times = span.tree, span.times
    parent_op = times.launching_op[np.maximum(tree.parent, 0)]
    return times.op_mask & main_thread_mask(span.events) & ((tree.parent < 0) | (parent_op < 0))


def _leaf_ops(span: SpanInput) -> np.ndarray:
    """Main-thread operators that call no other operator: where the arithmetic runs."""
    events, tree, times = span.events, span.tree, span.times
    ops = times.op_mask & main_thread_mask(events)
    has_child = np.zeros(len(events), dtype=bool)
    has_child[tree.parent[ops & (tree.parent >= 0)]] = True
    return ops & ~has_child


def _covered(span: SpanInput, mask: np.ndarray, within: intervals.IntervalSet) -> float:
    """Time of `within` covered by `mask`'s events."""
    start = span.events.ts_us[mask]
    return intervals.total_length(intervals.intersect(intervals.union(start, start + span.events.dur_us[mask]), within))


def _cpu_savings(span: SpanInput) -> Savings:
    n = len(span.steps)
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    t0 = float(span.steps.start_us[0])
    for cause, removed in cause_sets(span).items():
        if cause == "launch":
            continue  # GPU only; CPU forward/backward are costed as `dispatch` below
        length = intervals.total_length(removed) / n
        if cause == "optimizer_step" and length > 0:  # foreach keeps (most of) the per-tensor operators
            absolute = (removed[0] + t0, removed[1] + t0)
            ops = _covered(span, _top_ops(span), absolute) / n
            python = length - ops
            (python_low, python_high), (ops_low, ops_high) = KEPT_CPU_OPTIMIZER_PYTHON, KEPT_CPU_OPTIMIZER_OPS
            low[cause] = python * (1.0 - python_low) + ops * (1.0 - ops_low)
            high[cause] = python * (1.0 - python_high) + ops * (1.0 - ops_high)
            arithmetic = min(_covered(span, _leaf_ops(span) & (span.events.dur_us >= TINY_OP_US), absolute) / n, ops)
            low["optimizer_step_fused"], high["optimizer_step_fused"] = (
                python * (1.0 - kept_python) + (ops - arithmetic) * (1.0 - kept_dispatch) + arithmetic * (1.0 - kept_arithmetic)
                for kept_python, kept_dispatch, kept_arithmetic in zip(KEPT_CPU_FUSED_PYTHON, KEPT_CPU_FUSED_DISPATCH, KEPT_CPU_FUSED_ARITHMETIC)
            )
        elif length > 0:
            low[cause], high[cause] = length * (1.0 - KEPT[cause][0]), length * (1.0 - KEPT[cause][1])
    compute = span.compute_set
    compute_us = intervals.total_length(compute)
    if compute_us > 0:
        leaves = _leaf_ops(span)
        long_leaves = leaves & (span.events.dur_us >= TINY_OP_US)
        low["dispatch"] = max(compute_us - _covered(span, leaves, compute), 0.0) / n
        high["dispatch"] = max(compute_us - _covered(span, long_leaves, compute), 0.0) / n
    measured = float(span.steps.duration_us.sum()) / n
    return Savings(
        model="host_critical_path", saved_us_per_step_low=low, saved_us_per_step_high=high,
        modelled_step_us=measured, measured_step_us=measured,
    )  # fmt: skip


def savings(span: SpanInput) -> Savings | None:
    """Step time saved per modelled cause, low and high (None: a span without steps)."""
    if len(span.steps) == 0:
        return None
    model = build_model(span)
    return _gpu_savings(span, model) if model is not None else _cpu_savings(span)
