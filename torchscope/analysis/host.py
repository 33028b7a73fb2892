"""Host-side measurements used by the diagnosis rules: dispatch overhead, host-device synchronisation,
host-to-device copies, the optimizer's implementation, the work done inside a step but outside its
phases, and the DataLoader's iterator kind. Each function returns one typed section of per-step figures
(report/measurements.py); none prints or decides.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.anomaly import under_checks
from torchscope.analysis.garbage_collection import is_gc_event
from torchscope.analysis.module_hooks import hook_rows
from torchscope.analysis.frames import (
    is_interpreter_or_torch_code, is_library_code, is_measurement_frame, is_module_call, is_user_frame, readable, readable_totals,
    training_framework,
)
from torchscope.analysis.markers import (
    HOST_RANGES, batch_fetch_mask, closure_mask, frame_mask, is_optimizer_step_frame, is_queue_get, is_torch_optim_step_frame, name_mask, own_marker_mask,
    phase_masks, torch_optimizer_of_frame,
)  # fmt: skip
from torchscope.analysis.nesting import HostTree, launcher_of_device_events, nearest_ancestor_of, outermost_ancestor_of
from torchscope.analysis.operators import OpTimes
from torchscope.analysis.steps import StepWindows, event_steps, main_thread_mask
from torchscope.arrays import distinct, group_ids, median, nanmedian, read_only
from torchscope.report.measurements import ANOMALY_CHECK, MODULE_HOOK_SYNCS, Copies, DataLoader, Dispatch, LaunchOverhead, Optimizer, OutsideSteps, Synchronization
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
        "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
    }
)  # fmt: skip
PER_PARAM_OPTIMIZER_OPS = frozenset(
    {"aten::add_", "aten::mul_", "aten::addcdiv_", "aten::addcmul_", "aten::lerp_", "aten::sqrt", "aten::div_",
     "aten::sub_", "aten::maximum", "aten::div", "aten::sqrt_", "aten::neg", "aten::copy_"}
)  # fmt: skip
_FRAME_NAME = re.compile(r"^(?P<file>.*?)\((?P<line>\d+)\): (?P<func>.*)$")


TINY_OP_US = 30.0  # a CPU aten op this short is mostly dispatch cost (a few to ~10 us per op)


def dispatch_overhead(
    events: EventTable, steps: StepWindows, tree: HostTree, times: OpTimes, compute: intervals.IntervalSet
) -> Dispatch:
    """Within forward/backward time (`compute`): time spent in tiny top-level ops and in Python between
    ops on the main thread. Both shrink with vectorisation, torch.compile or larger batches."""
    n = max(len(steps), 1)
    main = main_thread_mask(events)
    parent_op = times.launching_op[np.maximum(tree.parent, 0)]
    top = times.op_mask & main & ((tree.parent < 0) | (parent_op < 0))
    start = events.ts_us[top]
    end = start + events.dur_us[top]
    in_compute = intervals.overlap_per_window(compute, start, end)
    tiny = events.dur_us[top] < TINY_OP_US
    # Garbage collections are host_overhead.gc_pauses' time, and torchscope's own hooks (the phase labels'
    # module pre-hooks: tens of us each under the Python tracer, one per module call) are measurement
    # overhead: neither is the user's Python between operators. Own frames that hold an operator (the
    # backward and closure wrappers around the user's code) stay.
    apart = np.flatnonzero((events.name_mask(is_gc_event) | events.name_mask(is_measurement_frame)) & main)
    apart_start, apart_end = events.ts_us[apart], events.ts_us[apart] + events.dur_us[apart]
    op_starts = np.sort(start)
    holds_op = np.searchsorted(op_starts, apart_end) > np.searchsorted(op_starts, apart_start)
    apart_start, apart_end = apart_start[~holds_op], apart_end[~holds_op]
    # The user's module hooks are host_overhead.module_hooks' time, operators and all.
    hooks = hook_rows(events, tree)
    apart_start = np.concatenate([apart_start, events.ts_us[hooks]])
    apart_end = np.concatenate([apart_end, events.ts_us[hooks] + events.dur_us[hooks]])
    python_time = intervals.subtract(compute, intervals.union(apart_start, apart_end)) if apart_start.size else compute
    covered = intervals.intersect(intervals.union(start, end), python_time)
    gap_us = intervals.total_length(python_time) - intervals.total_length(covered)
    counted = in_compute > 0
    return Dispatch(
        compute_phase_us_per_step=intervals.total_length(compute) / n,
        ops_per_step=float(counted.sum() / n),
        tiny_ops_per_step=float((counted & tiny).sum() / n),
        tiny_op_us_per_step=float(in_compute[tiny].sum() / n),
        python_gap_us_per_step=float(max(gap_us, 0.0) / n),
        median_op_us=float(median(events.dur_us[top][counted])) if counted.any() else 0.0,
    )


def forward_passes(events: EventTable, steps: StepWindows) -> int:
    """Separate forward passes on the main thread inside the steps: the forward ranges (torchscope's
    labels, PyTorch's own) merged where they nest or touch. One per step, or per micro-batch; one per
    sample where a Python loop calls the model sample by sample."""
    rows = np.flatnonzero(phase_masks(events)["forward"] & main_thread_mask(events))
    rows = rows[event_steps(events, steps)[rows] >= 0]
    start = events.ts_us[rows]
    return int(intervals.union(start, start + events.dur_us[rows])[0].size)


LONG_KERNEL_US = 20.0  # longer than a launch call takes (5-20 us, HTA)
CLOCK_SLACK_US = 2.0  # host and device timestamps are aligned to a few microseconds


def launch_overhead(events: EventTable, steps: StepWindows) -> LaunchOverhead | None:
    """Kernels shorter than the runtime call that launched them (HTA's "short kernels"); None without
    kernels in the steps."""
    step_index = event_steps(events, steps)
    kernels = events.kind_rows(Kind.KERNEL)
    kernels = kernels[step_index[kernels] >= 0]
    if kernels.size == 0:
        return None
    launcher = launcher_of_device_events(events, kernels)
    ok = launcher >= 0
    shorter = events.dur_us[kernels][ok] < events.dur_us[launcher[ok]]
    n = max(len(steps), 1)
    # Launches that return only once their kernel has finished (CUDA_LAUNCH_BLOCKING=1): judged on kernels
    # longer than any launch call takes, which an asynchronous launch returns long before they end.
    kernel_start, launch_start = events.ts_us[kernels[ok]], events.ts_us[launcher[ok]]
    kernel_end = kernel_start + events.dur_us[kernels[ok]]
    launch_end = launch_start + events.dur_us[launcher[ok]]
    long = events.dur_us[kernels[ok]] >= LONG_KERNEL_US
    waited = long & (launch_end >= kernel_end - CLOCK_SLACK_US)
    inside = np.minimum(launch_end, kernel_end) - np.maximum(launch_start, kernel_start)
    return LaunchOverhead(
        kernels_per_step=float(kernels.size / n),
        short_kernel_fraction=float(shorter.mean()) if ok.any() else 0.0,
        long_kernels_per_step=float(np.count_nonzero(long) / n),
        blocking_launches_per_step=float(np.count_nonzero(waited) / n),
        launch_wait_us_per_step=float(np.maximum(inside, 0.0).sum() / n),
        median_kernel_us=float(median(events.dur_us[kernels])),
        median_launch_us=float(median(events.dur_us[launcher[ok]])) if ok.any() else 0.0,
        runtime_us_per_step=float(
            events.dur_us[events.kind_mask((Kind.RUNTIME, Kind.DRIVER)) & (step_index >= 0)].sum() / n
        ),
    )


def _under_rows(tree: HostTree, rows: np.ndarray, of: np.ndarray) -> np.ndarray:
    """Per row of `of`: whether it runs inside one of `rows` (none: no climb)."""
    if rows.size == 0 or of.size == 0:
        return np.zeros(of.size, dtype=bool)
    mask = np.zeros(tree.parent.size, dtype=bool)
    mask[rows] = True
    return nearest_ancestor_of(tree, mask)[of] >= 0


def _user_frame(events: EventTable, tree: HostTree, index: int) -> str:
    """The innermost user-code Python frame (or "Call stack" entry) enclosing an event."""
    stack = events.strings[events.call_stack[index]] if events.call_stack[index] else ""
    for frame in stack.split(";"):
        if frame and not is_library_code(frame):
            return frame.strip()
    current = int(tree.parent[index])
    while current >= 0:
        if events.kind[current] == Kind.PYTHON_FUNCTION:
            name = events.strings[events.name[current]]
            if _FRAME_NAME.match(name) and not is_library_code(name):
                return name
        current = int(tree.parent[current])
    return ""


def sync_mask(events: EventTable) -> np.ndarray:
    """Runtime calls that block the host until the device catches up (computed once per table; callers
    must not modify it)."""
    return events.memo("sync_mask", lambda: read_only(name_mask(events, lambda s: s in SYNC_CALLS, (Kind.RUNTIME, Kind.DRIVER))))


def idle_explained_us_per_step(events: EventTable, steps: StepWindows, busy: intervals.IntervalSet) -> float:
    """Device-idle time inside the steps during which the host was loading data or blocked in a sync:
    idle time that the data-loading and synchronisation findings already account for."""
    windows = intervals.union(steps.start_us, steps.end_us)
    gaps = intervals.subtract(windows, busy)
    cause = phase_masks(events)["data_loading"] | sync_mask(events)
    start = events.ts_us[cause]
    explained = intervals.intersect(gaps, intervals.union(start, start + events.dur_us[cause]))
    return intervals.total_length(explained) / max(len(steps), 1)


def synchronization(events: EventTable, steps: StepWindows, tree: HostTree, times: OpTimes) -> Synchronization:
    """Host-blocking device synchronisations inside steps: count, time, the ops and call sites causing them."""
    syncs = np.flatnonzero(sync_mask(events) & (event_steps(events, steps) >= 0))
    n = max(len(steps), 1)
    if syncs.size == 0:
        return Synchronization()
    op = outermost_ancestor_of(tree, times.op_mask, syncs)
    checked = under_checks(events, tree, syncs)
    hooked = _under_rows(tree, hook_rows(events, tree), syncs)
    by_op: dict[str, float] = {}
    sites: dict[str, float] = {}
    for index, owner, check, hook in zip(syncs.tolist(), op.tolist(), checked.tolist(), hooked.tolist()):  # per sync call
        # Anomaly mode's checks and the user's module hooks under one name each, for their own findings
        # (a check's call site would only be the backward call).
        name = ANOMALY_CHECK if check else MODULE_HOOK_SYNCS if hook else events.strings[events.name[owner if owner >= 0 else index]]
        by_op[name] = by_op.get(name, 0.0) + float(events.dur_us[index])
        site = None if check or hook else _user_frame(events, tree, owner if owner >= 0 else index)
        if site:
            sites[site] = sites.get(site, 0.0) + float(events.dur_us[index])
    return Synchronization(
        syncs_per_step=float(syncs.size / n),
        sync_us_per_step=float(events.dur_us[syncs].sum() / n),
        by_op={k: v / n for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:8]},
        call_sites=dict(list(readable_totals({k: v / n for k, v in sites.items()}).items())[:5]),
    )


def host_to_device_copies(events: EventTable, steps: StepWindows) -> Copies:
    copies = np.flatnonzero((events.kind == Kind.MEMCPY) & (event_steps(events, steps) >= 0))
    n = max(len(steps), 1)
    names = np.array(events.text(events.name[copies]), dtype=object)
    htod = np.array(["HtoD" in s for s in names], dtype=bool)
    pageable = np.array(["Pageable" in s for s in names], dtype=bool) & htod
    nbytes = np.maximum(events.nbytes[copies], 0)
    return Copies(
        htod_per_step=float(htod.sum() / n),
        htod_us_per_step=float(events.dur_us[copies][htod].sum() / n),
        htod_bytes_per_step=float(nbytes[htod].sum() / n),
        pageable_htod_per_step=float(pageable.sum() / n),
        pageable_htod_us_per_step=float(events.dur_us[copies][pageable].sum() / n),
        pageable_htod_bytes_per_step=float(nbytes[pageable].sum() / n),
        pageable_bandwidth_gbps=float(nanmedian(events.bandwidth_gbps[copies][pageable])) if pageable.any() else 0.0,
    )


def optimizer_details(events: EventTable, steps: StepWindows, tree: HostTree, times: OpTimes) -> Optimizer:
    """How the optimizer step is implemented: fused / foreach kernels or a per-parameter loop; whether
    zero_grad fills gradients with zeros instead of setting them to None."""
    n = max(len(steps), 1)
    in_steps = event_steps(events, steps) >= 0
    named_step = name_mask(events, _is_optimizer_step, HOST_RANGES)
    # With stacks, the step wrapper's frame stands in for a range opened before the recorded window.
    step_range = named_step | frame_mask(events, is_optimizer_step_frame)
    zero_range = name_mask(events, _is_zero_grad, HOST_RANGES)
    ops = times.op_mask & ~step_range & ~zero_range
    # By time (on the range's thread), not by tree: Python frames recorded with stacks can straddle a
    # range's edges, which breaks strict nesting.
    # A closure (optimizer.step(closure): LBFGS, Lightning) runs forward and backward inside the step range:
    # not the optimizer's ops nor its time.
    phases = phase_masks(events)
    in_step_range = _starts_inside(events, step_range)
    nested = (closure_mask(events) | phases["forward"] | phases["backward"]) & in_step_range
    step_ops = ops & in_step_range & ~_starts_inside(events, nested)
    zero_ops = ops & _starts_inside(events, zero_range)

    def count(where: np.ndarray, predicate: Callable[[str], bool]) -> int:
        return int(events.name_mask(predicate, np.flatnonzero(where)).sum())

    fused = count(step_ops, lambda s: "_fused_" in s)
    foreach = count(step_ops, lambda s: "_foreach_" in s)
    per_param = count(step_ops, lambda s: s in PER_PARAM_OPTIMIZER_OPS)
    fills = count(zero_ops, lambda s: s in ("aten::zero_", "aten::fill_"))
    optimizer_names = sorted({s.split("#", 1)[1].rsplit(".", 1)[0] for s in events.text(distinct(events.name[named_step]))})
    if not optimizer_names:  # only frames show the step: its class from the torch.optim module whose step runs
        optimizer_names = sorted(filter(None, map(torch_optimizer_of_frame, events.text(distinct(events.name[frame_mask(events, is_torch_optim_step_frame)])))))
    implementation = "fused" if fused else "foreach" if foreach else ("for_loop" if per_param else "unknown")
    return Optimizer(
        optimizers=optimizer_names,
        implementation=implementation,
        ops_per_step=float(step_ops.sum() / n),
        per_param_ops_per_step=float(per_param / n),
        foreach_ops_per_step=float(foreach / n),
        fused_ops_per_step=float(fused / n),
        step_us_per_step=_outside_us(events, step_range, nested, steps) / n,
        zero_grad_fill_ops_per_step=float(fills / n),
        zero_grad_us_per_step=float(events.dur_us[zero_range & in_steps].sum() / n),
    )


def _is_optimizer_step(name: str) -> bool:
    return name.startswith("Optimizer.step#")


def _is_zero_grad(name: str) -> bool:
    return name.startswith("Optimizer.zero_grad#")


def _outside_us(events: EventTable, ranges: np.ndarray, excluded: np.ndarray, steps: StepWindows) -> float:
    """Time inside the steps covered by `ranges` and not by `excluded` (e.g. the closures inside optimizer
    steps). Clipped to the steps: a range still open when the profiler stopped can end long after the last
    step (Lightning's last `Optimizer.step#` range: 830 ms against 3 steps of 100 ms)."""
    covered = intervals.union(events.ts_us[ranges], events.ts_us[ranges] + events.dur_us[ranges])
    covered = intervals.intersect(covered, intervals.union(steps.start_us, steps.end_us))
    if not excluded.any():
        return intervals.total_length(covered)
    cut = intervals.union(events.ts_us[excluded], events.ts_us[excluded] + events.dur_us[excluded])
    return intervals.total_length(intervals.subtract(covered, cut))


def _starts_inside(events: EventTable, ranges: np.ndarray) -> np.ndarray:
    """Events that start inside one of the `ranges` on the same thread as that range."""
    inside = np.zeros(len(events), dtype=bool)
    if not ranges.any():
        return inside
    for key in distinct(events.thread_keys(np.flatnonzero(ranges))):  # one pass per thread holding such ranges (usually one)
        rows = events.thread_rows(key)  # only this thread's events are searched
        mine = rows[ranges[rows]]
        starts = events.ts_us[mine]
        covered = intervals.union(starts, starts + events.dur_us[mine])
        inside[rows] = intervals.contains(covered, events.ts_us[rows])
    return inside


def outside_phases(
    events: EventTable, steps: StepWindows, tree: HostTree, other: intervals.IntervalSet
) -> OutsideSteps:
    """Host work in the step time no phase covers (`other`), by name (us per step), largest first.

    Candidates are the outermost ops, ranges and Python frames that neither lie inside a phase range
    nor enclose one (a frame enclosing a phase, like the training loop itself, is not a culprit); each
    is credited with its overlap with `other`. Python frames count on the training thread only: another
    thread's frames span its whole life (`threading.py: _bootstrap`, a compile pool's or a progress bar's
    workers waiting for work), while its operators are work the step may wait for (the autograd engine's
    device threads run the backward's)."""
    phase = _phase_mask(events)
    main_thread = main_thread_mask(events)
    host = events.kind_mask((Kind.CPU_OP, Kind.USER_ANNOTATION)) | (events.kind_mask(Kind.PYTHON_FUNCTION) & main_thread)
    own = own_marker_mask(events)
    inside_phase = nearest_ancestor_of(tree, phase) >= 0
    around_steps = encloses_markers(events, tree)
    profiler_frames = events.name_mask(is_measurement_frame)
    candidate = host & ~own & ~profiler_frames & ~inside_phase & ~around_steps
    # A decorator's wrapper frame (`@torch.no_grad()` runs the function inside `decorate_context`) names no
    # work: the function it wraps is the culprit.
    wrappers = candidate & events.name_mask(_is_passthrough_wrapper)
    named = candidate & ~wrappers
    parent = tree.parent
    if wrappers.any():  # past the wrappers to the nearest named ancestor (a walk over the whole tree)
        under_named = nearest_ancestor_of(tree, named)[np.maximum(parent, 0)] >= 0
    else:
        under_named = named[np.maximum(parent, 0)]
    chosen = np.flatnonzero(named & ((parent < 0) | ~under_named))
    # The time of the profiler's and torchscope's own frames inside the steps (a step hook, and what it
    # calls: signal.signal, contextlib) is overhead, not a culprit's. Their calls need not nest in the
    # tree (the next ProfilerStep range opens inside the hook), so their time is taken out, not their
    # descendants. Not `torchscope run`'s runner frames: they enclose the steps and hold the whole script.
    # Garbage collections are host_overhead.gc_pauses' time, not the culprit's that allocated when one started.
    hooks = np.flatnonzero((profiler_frames & ~around_steps & main_thread) | events.name_mask(is_gc_event))
    if hooks.size:
        hook_start = events.ts_us[hooks]
        other = intervals.subtract(other, intervals.union(hook_start, hook_start + events.dur_us[hooks]))
    if chosen.size == 0 or other[0].size == 0:
        return OutsideSteps()
    start = events.ts_us[chosen]
    overlap = intervals.overlap_per_window(other, start, start + events.dur_us[chosen])
    chosen, overlap = _user_code_under_frameworks(events, tree, chosen, overlap, other, main_thread)
    names, group = group_ids(events.name[chosen])
    totals = np.bincount(group, overlap, names.size) / max(len(steps), 1)
    top = np.argsort(-totals)[:10]
    # The model calls among them at any depth (`sum(model(x) ... for x in val)` names `sum`): one union.
    modules = np.flatnonzero(candidate & events.name_mask(is_module_call))
    module_start = events.ts_us[modules]
    model_calls = intervals.intersect(intervals.union(module_start, module_start + events.dur_us[modules]), other)
    # A training framework's own frames among them (Lightning's hooks, a Trainer's bookkeeping), over all
    # culprits, not only the top ones: a framework's many small calls add up.
    frameworks: dict[str, float] = {}
    framework_culprits: list[str] = []
    for i in np.flatnonzero(totals > 0).tolist():
        name = events.strings[int(names[i])]
        framework = training_framework(name)
        if framework is not None:
            frameworks[framework] = frameworks.get(framework, 0.0) + float(totals[i])
            framework_culprits.append(f"{framework}: {readable(name)}")
    culprits = readable_totals({events.strings[int(names[i])]: float(totals[i]) for i in top if totals[i] > 0})
    return OutsideSteps(
        culprits_us_per_step=culprits,
        culprit_steps_share=_steps_share(events, steps, chosen, overlap, group, names, top, culprits),
        model_calls_us_per_step=intervals.total_length(model_calls) / max(len(steps), 1),
        foreach_norm_culprits=_foreach_norm_culprits(events, steps, tree, chosen),
        framework_us_per_step=dict(sorted(frameworks.items(), key=lambda kv: -kv[1])),
        framework_culprits=list(dict.fromkeys(framework_culprits)),
    )


def _steps_share(
    events: EventTable, steps: StepWindows, chosen: np.ndarray, overlap: np.ndarray, group: np.ndarray,
    names: np.ndarray, top: np.ndarray, culprits: dict[str, float],
) -> dict[str, float]:
    """Per readable culprit name (of `culprits`), the share of the steps it took time in (`chosen`, their
    `overlap` with the time outside the phases and their name `group` as in `outside_phases`)."""
    step = steps.index_of(events.ts_us[chosen])
    ran = (overlap > 0) & (step >= 0)
    seen: dict[str, set[int]] = {}
    for i in top.tolist():
        name = readable(events.strings[int(names[i])])
        if name in culprits:
            seen.setdefault(name, set()).update(step[ran & (group == i)].tolist())
    return {name: len(held) / max(len(steps), 1) for name, held in seen.items()}


def _user_code_under_frameworks(
    events: EventTable, tree: HostTree, chosen: np.ndarray, overlap: np.ndarray, other: intervals.IntervalSet, main_thread: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The culprits with the user's own code under a training framework's culprit made culprits of their
    own: Lightning runs the user's callbacks and hooks from its dispatch (`_call_callback_hooks`), whose
    time is the user's, not the framework's fixed cost. Each outermost user frame below a framework culprit
    (no other culprit or user frame between them) is added with its overlap, which the framework culprit
    gives up."""
    distinct, slot = group_ids(events.name[chosen])
    in_framework = np.array([training_framework(events.strings[int(i)]) is not None for i in distinct.tolist()], dtype=bool)[slot]
    if not in_framework.any():
        return chosen, overlap
    user = events.kind_mask(Kind.PYTHON_FUNCTION) & main_thread & events.name_mask(is_user_frame)
    marks = user.copy()
    marks[chosen] = True
    nearest = nearest_ancestor_of(tree, marks)
    rows = np.flatnonzero(user & (tree.parent >= 0))
    above = nearest[tree.parent[rows]]
    position = np.full(len(events), -1, dtype=np.int64)
    position[chosen[in_framework]] = np.flatnonzero(in_framework)
    owner = np.where(above >= 0, position[np.maximum(above, 0)], -1)
    rows, owner = rows[owner >= 0], owner[owner >= 0]
    if rows.size == 0:
        return chosen, overlap
    start = events.ts_us[rows]
    own = intervals.overlap_per_window(other, start, start + events.dur_us[rows])
    overlap = overlap.copy()
    np.subtract.at(overlap, owner, own)
    return np.r_[chosen, rows], np.r_[np.maximum(overlap, 0.0), own]


def _is_foreach_norm(name: str) -> bool:
    return name == "aten::_foreach_norm"


def _foreach_norm_culprits(events: EventTable, steps: StepWindows, tree: HostTree, chosen: np.ndarray) -> list[str]:
    """The culprits under which `aten::_foreach_norm` ran in the steps (clip_grad_norm_ on its multi-tensor
    path; the op elsewhere, in a norm logged or an optimizer, is not the clipping's), readable names."""
    norms = np.flatnonzero(events.name_mask(_is_foreach_norm) & events.kind_mask(Kind.CPU_OP))
    norms = norms[event_steps(events, steps)[norms] >= 0]
    if norms.size == 0:
        return []
    culprit = np.zeros(len(events), dtype=bool)
    culprit[chosen] = True
    ancestor = tree.parent[norms].astype(np.int64)
    found: set[int] = set()
    while (live := ancestor >= 0).any():  # up from the few norm ops only
        hit = live & culprit[np.maximum(ancestor, 0)]
        found.update(events.name[ancestor[hit]].tolist())
        ancestor[hit] = -1
        ancestor[live & ~hit] = tree.parent[ancestor[live & ~hit]]
    return sorted(readable_totals({events.strings[i]: 0.0 for i in found}))


_PASSTHROUGH_WRAPPER = re.compile(
    r"(^|/)(torch/utils/_contextlib\.py\(\d+\): decorate_context|contextlib\.py\(\d+\): inner"
    r"|torch/nn/utils/clip_grad\.py\(\d+\): _no_grad_wrapper)$"
)
# The grad-mode switching a decorator does around the function (its context's clone, __enter__, __exit__).
_GRAD_MODE_PLUMBING = re.compile(r"(^|/)torch/(utils/_contextlib|autograd/grad_mode)\.py\(\d+\): ")


def _is_passthrough_wrapper(name: str) -> bool:
    """The frame a decorator runs the decorated function in: torch's grad-mode decorators (`@torch.no_grad()`,
    `@torch.inference_mode()`, `clip_grad_norm_`'s `_no_grad_wrapper`) and contextlib's ContextDecorator;
    also the grad-mode switching around the call, which is no culprit of its own."""
    return _PASSTHROUGH_WRAPPER.search(name) is not None or _GRAD_MODE_PLUMBING.search(name) is not None


def encloses_markers(events: EventTable, tree: HostTree) -> np.ndarray:
    """Events (of `tree`, the table's host tree) that enclose a phase range or one of torchscope's own
    markers: the training loop, `<module>`. Once per table (read-only): host work outside the phases and
    collectives' per-phase culprits both leave them out."""
    return events.memo("host.encloses_markers", lambda: read_only(encloses(tree, _phase_mask(events) | own_marker_mask(events))))


def _phase_mask(events: EventTable) -> np.ndarray:
    phase = np.zeros(len(events), dtype=bool)
    for mask in phase_masks(events).values():
        phase |= mask
    return phase


def encloses(tree: HostTree, mask: np.ndarray) -> np.ndarray:
    """Events that have a descendant in `mask`."""
    flag = np.zeros(mask.size, dtype=bool)
    # Up from the marked events only (markers are a small part of the table), one step a round; an
    # ancestor already flagged has had its own ancestors flagged, so the climb stops there.
    rows = tree.parent[mask]
    rows = rows[rows >= 0]
    while rows.size:
        rows = rows[~flag[rows]]
        flag[rows] = True
        rows = tree.parent[rows]
        rows = rows[rows >= 0]
    return flag


def dataloader_kind(events: EventTable, steps: StepWindows, tree: HostTree) -> DataLoader:
    """DataLoader fetches by iterator (`_SingleProcessDataLoaderIter` means num_workers=0), and the loop's
    batch fetches from other iterators with the Python calls they run."""
    loader = events.name_mask(lambda s: s.startswith("enumerate(DataLoader)#"))
    fetches = np.flatnonzero(loader)
    single = events.name_mask(lambda s: "_SingleProcessDataLoaderIter" in s, fetches)
    multi = events.name_mask(lambda s: "_MultiProcessingDataLoaderIter" in s, fetches)
    # A next() that holds a DataLoader fetch is that DataLoader's; one that resumes code of the user's (or
    # of an installed package: a dataset library's generator) fetches from something else. torch's and
    # torchscope's frames under it are a DataLoader's too (its fetch range can fall outside the window).
    calls = np.flatnonzero(batch_fetch_mask(events))
    calls = calls[~encloses(tree, loader)[calls]] if calls.size else calls
    frames = _called_frames(events, tree, calls)
    frames = frames[~events.name_mask(is_interpreter_or_torch_code, frames)]
    names, slot = group_ids(events.name[frames])
    totals = np.bincount(slot, events.dur_us[frames], names.size) / max(len(steps), 1)
    readable = readable_totals({events.strings[int(i)]: float(us) for i, us in zip(names.tolist(), totals.tolist())})
    return DataLoader(
        single_process_fetches=float(single.sum()),
        multi_process_fetches=float(multi.sum()),
        iterator_fetches=float(distinct(tree.parent[frames]).size),
        iterator_frames_us_per_step=dict(list(readable.items())[:3]),
        queue_waits=float(events.name_mask(is_queue_get, calls).sum()),
    )


def _called_frames(events: EventTable, tree: HostTree, calls: np.ndarray) -> np.ndarray:
    """The Python calls made directly inside `calls` (the generator a next() resumes), ascending."""
    if calls.size == 0:
        return calls
    inside = np.zeros(len(events), dtype=bool)
    inside[calls] = True
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    parent = tree.parent[python]
    return python[(parent >= 0) & inside[np.maximum(parent, 0)]]
