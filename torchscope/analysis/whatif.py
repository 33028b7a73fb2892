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

from typing import Callable

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.arithmetic import kept_matmul_us
from torchscope.analysis.autograd_markers import autograd_marker_set
from torchscope.analysis.host import TINY_OP_US, sync_mask
from torchscope.analysis.steps import main_thread_mask
from torchscope.analysis.markers import HOST_RANGES, closure_mask, phase_masks
from torchscope.analysis.nesting import launcher_of_device_events
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids, median, read_only
from torchscope.report.measurements import Savings
from torchscope.trace.kinds import DEVICE_KINDS
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


class QueueScan(msgspec.Struct, frozen=True):
    """What `_scan` needs of queued ops, sorted by segment, stream, then queue order, that does not depend
    on when they are ready: computed once per span, reused by every replay (a dozen per span). A *run* is
    one stream's ops within one segment."""

    bounds: np.ndarray  # ops of segment j are [bounds[j], bounds[j + 1])
    run_bounds: np.ndarray  # runs of segment j are [run_bounds[j], run_bounds[j + 1])
    run_stream: np.ndarray  # each run's stream
    run_first: np.ndarray  # each run's first op, as a position within its segment
    run_last: np.ndarray  # each run's last op, likewise
    cum: np.ndarray  # summed duration within the op's run, up to and including it
    cum_before: np.ndarray  # the same, less the op's own duration
    lift_rank: np.ndarray  # the op's run's rank within its segment, from 1 (the segmented max's lift)


class DeviceQueue(msgspec.Struct, frozen=True):
    """The span's device ops as the replay needs them (times from span start), grouped by the sync
    before which they are launched (`segment`), and within a segment by stream, then queue order: the
    order each replay scans them in, computed once per span rather than once per replay."""

    launch_us: np.ndarray
    lag_us: np.ndarray
    dur_us: np.ndarray
    stream: np.ndarray  # dense stream index
    scan: QueueScan  # one segment per sync, plus the tail


class StepModel(msgspec.Struct, frozen=True):
    """One span as a host timeline, device queues and synchronisations (times from span start)."""

    steps: int
    measured_us: float
    host_end_us: float
    queue: DeviceQueue
    sync_start_us: np.ndarray
    sync_end_us: np.ndarray


def _device_queue(events: EventTable, t0: float, t1: float, sync_start: np.ndarray) -> DeviceQueue:
    ops = events.kind_rows(DEVICE_KINDS)
    launcher = launcher_of_device_events(events, ops)
    start = events.ts_us[ops] - t0
    launch = np.where(launcher >= 0, events.ts_us[np.maximum(launcher, 0)] - t0, start)
    keep = (launch >= 0) & (launch < t1 - t0)
    ops, start, launch = ops[keep], start[keep], launch[keep]
    dur = events.dur_us[ops]
    stream = group_ids(events.stream[ops])[1].astype(np.int64)  # dense: a table over the ids, not a sort
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
    return DeviceQueue(launch[order], lag[order], dur[order], stream, _queue_scan(dur[order], stream, bounds))


def build_model(span: SpanInput) -> StepModel | None:
    """The replay model of a span with steps and device ops (None otherwise)."""
    steps, events = span.steps, span.events
    if len(steps) == 0 or not span.has_device:
        return None
    t0, t1 = float(steps.start_us[0]), float(steps.end_us[-1])
    host = _main_host_rows(events)
    host = host[(events.ts_us[host] >= t0) & (events.ts_us[host] < t1)]
    host_end = float(np.max(events.ts_us[host] + events.dur_us[host])) - t0 if host.size else 0.0
    syncs = _sync_rows(events)
    syncs = syncs[(events.ts_us[syncs] >= t0) & (events.ts_us[syncs] < t1)]
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


def _queue_scan(dur: np.ndarray, stream: np.ndarray, bounds: np.ndarray) -> QueueScan:
    """The ready-independent part of `_scan` for ops sorted by segment, stream, then queue order. Each
    segment's sums are its own (as a scan of that segment alone takes them), so every replay's float
    arithmetic is the same whichever segments share the plan."""
    first = np.zeros(stream.size, dtype=bool)
    first[1:] = stream[1:] != stream[:-1]
    first[bounds[:-1][bounds[:-1] < stream.size]] = True
    run_first = np.flatnonzero(first)
    run_last = np.append(run_first[1:] - 1, stream.size - 1) if run_first.size else run_first
    total = np.empty(dur.size)
    lift_rank = np.empty(dur.size, dtype=np.int64)
    for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # one per sync (a few per step)
        np.cumsum(dur[begin:end], out=total[begin:end])
        np.cumsum(first[begin:end], out=lift_rank[begin:end])
    run_base = np.repeat(run_first, np.diff(np.append(run_first, stream.size)))
    before = total - dur  # cumulative duration before each op, over its segment's streams
    cum = total - before[run_base]
    run_bounds = np.searchsorted(run_first, bounds, side="left")
    segment_start = np.repeat(bounds[:-1], np.diff(run_bounds))
    return QueueScan(
        bounds, run_bounds, stream[run_first], run_first - segment_start, run_last - segment_start, cum, cum - dur, lift_rank,
    )  # fmt: skip


def _scan_segment(plan: QueueScan, segment: int, ready: np.ndarray, carry: np.ndarray, with_ends: bool = True) -> np.ndarray:
    """Replay one segment's queues, one replay per row: end_k = max(ready_k, end_{k-1}) + dur_k per stream,
    each starting after `carry[row, stream]`, which then holds each stream's last end. Returns the ops'
    ends (none without `with_ends`: the replays read only the carry; `ready`, the rows' ready times of
    the segment's ops, is overwritten). Every row gets the operations a replay alone would (row-wise
    reductions and accumulations), so the same floats."""
    begin, end = int(plan.bounds[segment]), int(plan.bounds[segment + 1])
    runs = slice(int(plan.run_bounds[segment]), int(plan.run_bounds[segment + 1]))
    if begin == end:
        return ready
    first, streams = plan.run_first[runs], plan.run_stream[runs]
    ready[:, first] = np.maximum(ready[:, first], carry[:, streams])
    value = ready  # in place: the caller's copy
    value -= plan.cum_before[begin:end]
    # Segmented running max: lift each run above all earlier ones, then take it back down.
    lift = plan.lift_rank[begin:end] * (value.max(axis=1) - value.min(axis=1) + 1.0)[:, None]  # np.ptp's arithmetic
    value += lift
    np.maximum.accumulate(value, axis=1, out=value)
    # Within a stream ends only grow, so each run's last op holds its stream's new carry: the ends of
    # those ops alone, with the arithmetic of every op's end below.
    last = plan.run_last[runs]
    last_ends = plan.cum[begin:end][last] + value[:, last]
    last_ends -= lift[:, last]
    carry[:, streams] = np.maximum(carry[:, streams], last_ends)
    if not with_ends:
        return value[:, :0]
    ends = plan.cum[begin:end] + value
    ends -= lift
    return ends


def _scan(ready: np.ndarray, dur: np.ndarray, stream: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """End times of in-order queues, ops sorted by stream then queue order, each stream starting after
    `carry[stream]` (one segment, one row of `_scan_segment`)."""
    plan = _queue_scan(np.asarray(dur, dtype=np.float64), np.asarray(stream), np.array([0, np.size(ready)]))
    return _scan_segment(plan, 0, np.array(ready, dtype=np.float64)[None, :], carry.copy()[None, :])[0]


def replay(model: StepModel, removed: intervals.IntervalSet = intervals.EMPTY, kept: float = 1.0, blocking_syncs: bool = True) -> float:
    """The modelled span time with `removed` host time shrunk to `kept` of itself.

    A host time t moves to t - (1 - kept) * (removed time before t) + the delay accumulated at the
    syncs replayed so far; the device queues are replayed one segment (ops launched between two syncs)
    at a time, since each sync's wait depends on what is still queued."""
    return _replays(model, [Replay(_removed_before(model, removed), 1.0 - kept, blocking_syncs)])[0]


class RemovedBefore(msgspec.Struct, frozen=True):
    """Removed host time before each launch and before each sync point (start, end, host end) of a model:
    the same for every kept share of one cause, so computed once per cause."""

    launch: np.ndarray
    sync_points: np.ndarray


class Replay(msgspec.Struct, frozen=True):
    """One replay's inputs: the removed time before each point, the share of it removed, and whether the
    host waits at the syncs."""

    removed: RemovedBefore
    shrink: float
    blocking_syncs: bool = True


def _sync_points(model: StepModel) -> np.ndarray:
    return np.concatenate((model.sync_start_us, model.sync_end_us, [model.host_end_us]))


def _removed_before(model: StepModel, removed: intervals.IntervalSet) -> RemovedBefore:
    return RemovedBefore(intervals.covered_before(removed, model.queue.launch_us), intervals.covered_before(removed, _sync_points(model)))


def _replays(model: StepModel, replays: list[Replay]) -> list[float]:
    """The modelled span time of each replay (see `replay`), side by side: one row each, segment by
    segment, so a span's dozen replays cost one pass of numpy calls, not a dozen."""
    q = model.queue
    shrink = np.array([r.shrink for r in replays])[:, None]
    ready = q.launch_us - shrink * np.stack([r.removed.launch for r in replays]) + q.lag_us
    moved = _sync_points(model) - shrink * np.stack([r.removed.sync_points for r in replays])
    blocking = np.array([r.blocking_syncs for r in replays])
    n_sync = model.sync_start_us.size
    carry = np.full((len(replays), int(q.stream.max()) + 1 if q.stream.size else 1), -np.inf)
    extra = np.zeros(len(replays))  # host delay (or advance) accumulated at the syncs replayed so far
    bounds = q.scan.bounds.tolist()

    def advance(segment: int) -> None:
        _scan_segment(q.scan, segment, ready[:, bounds[segment] : bounds[segment + 1]] + extra[:, None], carry, with_ends=False)

    fixed = np.minimum(model.sync_end_us - model.sync_start_us, SYNC_FIXED_US).tolist()
    for j in range(n_sync):
        advance(j)
        done = moved[:, j] + extra + fixed[j]
        resumed = np.where(blocking, np.maximum(done, carry.max(axis=1)), done)
        extra += resumed - (moved[:, n_sync + j] + extra)
    advance(n_sync)
    spans: list[float] = np.maximum(moved[:, -1] + extra, carry.max(axis=1)).tolist()  # Python floats: extracts are msgpack-cached
    return spans


def _main_host_rows(events: EventTable) -> np.ndarray:
    """The rows of the main thread's CPU ops and annotations (once per table: the model and every cause
    start from them; shared, so read-only). From the host ranges' rows, which other analyses keep too,
    rather than two masks over every event."""
    def compute() -> np.ndarray:
        host = events.kind_rows(HOST_RANGES)
        return read_only(host[main_thread_mask(events)[host]])

    return events.memo("main_host_rows", compute)


def _sync_rows(events: EventTable) -> np.ndarray:
    """The rows of the synchronisation calls (a few per step): the model and the causes read their times
    from these rather than masking every event's."""
    return events.memo("whatif_sync_rows", lambda: read_only(np.flatnonzero(sync_mask(events))))


def _main_names(span: SpanInput, predicate: Callable[[str], bool]) -> np.ndarray:
    """Per main-thread host range (`_main_host_rows`): whether its name matches `predicate`, asked once
    per distinct name among those rows (a table over their string ids, not a mask over every event)."""
    events = span.events

    def distinct_names() -> tuple[np.ndarray, np.ndarray]:  # once per table: each cause asks
        ids, codes = group_ids(events.name[_main_host_rows(events)])
        return read_only(ids), read_only(codes.reshape(-1))

    ids, codes = events.memo("whatif_main_names", distinct_names)
    matches = np.fromiter((bool(predicate(events.strings[i])) for i in ids.tolist()), bool, ids.size)
    return matches[codes]


def _is_optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#")


def _is_zero_grad(name: str) -> bool:
    return name.startswith("Optimizer.zero_grad#")


def _main_set(span: SpanInput, keep: np.ndarray | None, allowed: intervals.IntervalSet, t0: float) -> intervals.IntervalSet:
    """Main-thread intervals of the host ranges `keep` selects (a mask over `_main_host_rows`; None: all of
    them) within `allowed`, as times from `t0`."""
    events = span.events
    chosen = _main_host_rows(events)
    if keep is not None:
        chosen = chosen[keep]
    start = events.ts_us[chosen]
    found = intervals.intersect(intervals.union(start, start + events.dur_us[chosen]), allowed)
    return found[0] - t0, found[1] - t0


def _less_closures(span: SpanInput, allowed: intervals.IntervalSet) -> intervals.IntervalSet:
    events = span.events
    closures = np.flatnonzero(closure_mask(events))
    start = events.ts_us[closures]
    marked_start, marked_end = autograd_marker_set(events)  # the forward and backward markers, merged once per table
    # A union only selects starts and running ends: merging the merged markers with the closures gives
    # the set that merging all of their intervals at once gives.
    both = intervals.union(np.concatenate((marked_start, start)), np.concatenate((marked_end, start + events.dur_us[closures])))
    return intervals.subtract(allowed, both)


def cause_sets(span: SpanInput) -> dict[str, intervals.IntervalSet]:
    """Each modelled cause's main-thread intervals inside the steps, minus the syncs (which the replay
    treats as waits of their own), as times from the span's first step start."""
    events, steps, t0 = span.events, span.steps, float(span.steps.start_us[0])
    phases = phase_masks(events)
    syncs = _sync_rows(events)
    sync_start = events.ts_us[syncs]
    allowed = intervals.subtract(intervals.union(steps.start_us, steps.end_us), intervals.union(sync_start, sync_start + events.dur_us[syncs]))
    host_ops = _main_set(span, None, allowed, 0.0)
    other_start, other_end = span.phase_sets["other"]
    outside = intervals.intersect((other_start, other_end), host_ops)
    compute = span.compute_set
    return {
        "data_loading": _main_set(span, phases["data_loading"][_main_host_rows(events)], allowed, t0),
        # Less a closure's forward and backward (LBFGS, Lightning): they run inside the step range.
        "optimizer_step": _main_set(span, _main_names(span, _is_optimizer_step), _less_closures(span, allowed), t0),
        "zero_grad": _main_set(span, _main_names(span, _is_zero_grad), allowed, t0),
        "outside_steps": (outside[0] - t0, outside[1] - t0),
        "launch": intervals.intersect((compute[0] - t0, compute[1] - t0), (host_ops[0] - t0, host_ops[1] - t0)),
    }


def _gpu_savings(span: SpanInput, model: StepModel) -> Savings:
    nothing = _removed_before(model, intervals.EMPTY)
    causes = [(cause, removed) for cause, removed in cause_sets(span).items() if intervals.total_length(removed) > 0]
    replays = [Replay(nothing, 0.0)]
    for cause, removed in causes:
        before = _removed_before(model, removed)  # one search for both kept shares
        replays += [Replay(before, 1.0 - kept) for kept in KEPT[cause]]
    if model.sync_start_us.size:
        replays.append(Replay(nothing, 0.0, blocking_syncs=False))
    base, *times = _replays(model, replays)
    saved = [max(base - time, 0.0) / model.steps for time in times]
    low = {cause: saved[2 * i] for i, (cause, _) in enumerate(causes)}
    high = {cause: saved[2 * i + 1] for i, (cause, _) in enumerate(causes)}
    if model.sync_start_us.size:
        unblocked = saved[-1]
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


def _covered(span: SpanInput, mask: np.ndarray, within: intervals.IntervalSet) -> float:
    """Time of `within` covered by `mask`'s events."""
    start = span.events.ts_us[mask]
    return intervals.total_length(intervals.intersect(intervals.union(start, start + span.events.dur_us[mask]), within))


def _cpu_savings(span: SpanInput) -> Savings:
    n = len(span.steps)
    work = span.arithmetic  # where the arithmetic runs: the optimizer's and forward/backward's
    leaves, units = np.zeros(len(span.events), dtype=bool), np.zeros(len(span.events), dtype=bool)
    leaves[work.leaves] = True
    units[work.units] = True
    long_leaves = leaves & (span.events.dur_us >= TINY_OP_US)
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
            arithmetic = min(_covered(span, long_leaves | units, absolute) / n, ops)
            low["optimizer_step_fused"], high["optimizer_step_fused"] = (
                python * (1.0 - kept_python) + (ops - arithmetic) * (1.0 - kept_dispatch) + arithmetic * (1.0 - kept_arithmetic)
                for kept_python, kept_dispatch, kept_arithmetic in zip(KEPT_CPU_FUSED_PYTHON, KEPT_CPU_FUSED_DISPATCH, KEPT_CPU_FUSED_ARITHMETIC)
            )
        elif length > 0:
            low[cause], high[cause] = length * (1.0 - KEPT[cause][0]), length * (1.0 - KEPT[cause][1])
    compute = span.compute_set
    compute_us = intervals.total_length(compute)
    if compute_us > 0:
        unit_us, unit_gflop = work.units_within(span.events, compute)
        kept_low, kept_high = kept_matmul_us(unit_us, unit_gflop, work.large_gflops(span.events.dur_us))
        low["dispatch"] = max(compute_us - _covered(span, leaves, compute) - kept_low, 0.0) / n
        high["dispatch"] = max(compute_us - _covered(span, long_leaves, compute) - kept_high, 0.0) / n
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
