"""The profiler's cost per phase, and the phase shares without it (docs/capture.md, "Measurement that
does not distort").

Recording costs time per recorded event: torch's Python tracer (``with_stack``) adds about a
microsecond to every Python call, and each operator event (with its shapes, stack and memory records)
several. A phase of pure-Python work therefore runs 2-3.5x slower under the profiler while a phase of
long operators runs ~1.0x, and the trace's shares overstate the Python-heavy phases.

Two measurements correct it:

* per span (:func:`extract`): the Python-function and operator events recorded in each host phase, per
  step (an event belongs to the phase whose time holds its start);
* per run (:func:`correct`, after assembly), from the capture's own clock (the manifest's
  ``environment.step_times``: steps the profiler recorded, steps it did not, and the DataLoader fetch time
  of the latter):

  - ``fetch_clock`` (when fetch times were recorded): the data-loading share is measured directly, the
    median over the unprofiled steps of fetch time over step time. A ratio within the same steps, so a load
    change between steps cancels. The other phases share the rest: in proportion to their medians over the
    unprofiled steps where the capture timed the phase hooks' ranges too (``unprofiled_phase_us``; phases
    it does not time, "other" and communication, share the step's untimed remainder by their recorded
    times), else in their recorded proportions less the recording cost of their events.
  - ``step_clock`` (otherwise): the overhead per step, the difference of the two step medians, is spread
    over the phases in proportion to their events, an operator event weighing :data:`OP_EVENT_WEIGHT`
    Python events, and each phase's time less its part gives the shares without the profiler. Noisier:
    it compares different steps. Where the phase clock timed the unprofiled steps, the phases are split
    by its medians instead, as above (the untimed phases, data loading among them, by their estimate).

Without unprofiled steps in the manifest (a bare trace, or a schedule with no steps outside the window
after the first) nothing is corrected and ``method`` says so; nor when the recorded events, even at
:data:`MAX_EVENT_US` each, cannot have cost 5 % of the step (``negligible``): then a difference between
recorded and unprofiled steps is the machine's load changing, and "correcting" would add that noise.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.reduce import merge_sections
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids, median
from torchscope.report.measurements import ProfilerOverhead
from torchscope.report.model import Report
from torchscope.rundir.labels import PHASE_LABELS
from torchscope.rundir.thinning import HEADER_KEY, dropped_starts
from torchscope.trace.kinds import Kind

# What one operator event costs to record, in Python-function events: measured on this project's CPU
# machine (torch 2.13, shapes + memory + stack + FLOPs on) at 3-14 us per operator against 0.4-1.0 us per
# Python call, about 10x in every run of the calibration (docs/capture.md).
OP_EVENT_WEIGHT = 10.0
MAX_EVENT_US = 2.0  # the most one recorded Python event cost on the loaded 2-core machine (0.4-1.2 us measured)
MAX_OVERHEAD_SHARE_UNSEEN = 0.05  # below 5 % of the step at that price, the profiler cannot have distorted it
MIN_CALIBRATION_EVENTS = 1000  # recorded events per step the data-loading phase needs to price one event
MIN_OVERHEAD_SHARE = 0.02  # below 2 % of the step the difference of two medians is noise: no correction


def _count_in(parts: dict[str, intervals.IntervalSet], ts: np.ndarray, steps: int) -> dict[str, float]:
    """Events (start times `ts`, sorted) inside each phase's interval set, per step."""
    counts: dict[str, float] = {}
    for name, (starts, ends) in parts.items():
        if starts.size == 0:
            continue
        # A set's intervals are disjoint and `ts` is sorted: each interval holds the points between its edges'
        # positions in `ts` (a search per interval, not per point; the edges in order, start, end, start...,
        # are sorted keys, which one search walks faster than two).
        edges = np.searchsorted(ts, np.column_stack((starts, ends)).ravel(), side="left")
        n = int((edges[1::2] - edges[0::2]).sum())
        if n:
            counts[name] = n / steps
    return counts


# torchscope's own step call (Profiler.step: the step clock, the torch profiler's step, its stderr filter)
# runs inside the recorded steps and holds no training work. (Its hooks' frames wrap the training's own
# calls, whose C++ children the Python tracer does not nest under them: their self time is not theirs.)
_OWN_STEP = re.compile(r"[/\\]torchscope[/\\]capture[/\\]profiler\.py\(\d+\): step$")


def _is_own_step(name: str) -> bool:
    """A named predicate (`EventTable.name_mask` keeps its answers per string), not the bound `search`."""
    return _OWN_STEP.search(name) is not None


def _own_time(span: SpanInput, parts: dict[str, intervals.IntervalSet], steps: int) -> dict[str, float]:
    """Time per step and phase in torchscope's own step calls (inclusive)."""
    events = span.events
    rows = np.flatnonzero(events.kind_mask(Kind.PYTHON_FUNCTION) & events.name_mask(_is_own_step))
    if rows.size == 0:
        return {}
    order = np.argsort(events.ts_us[rows], kind="stable")
    ts, us = events.ts_us[rows][order], events.dur_us[rows][order]
    totals: dict[str, float] = {}
    for name, (starts, ends) in parts.items():
        if starts.size == 0:
            continue
        index = np.searchsorted(starts, ts, side="right") - 1
        inside = (index >= 0) & (ts < ends[np.maximum(index, 0)])
        if inside.any():
            totals[name] = float(us[inside].sum()) / steps
    return totals


def extract(span: SpanInput) -> Optional[ProfilerOverhead]:
    """The recorded events per phase and step of one span (None without steps)."""
    steps = len(span.steps)
    if steps == 0:
        return None
    events = span.events
    ts = events.ts_us
    parts = span.phase_sets
    # A trace thinned to its size budget lost its shortest Python calls but says where they started: they
    # were recorded, so they cost their time as the kept ones did (rundir/thinning.py).
    # Stable sorts (timsort): the starts come nearly in order, which it merges in one pass; the same values.
    python_ts = np.sort(np.concatenate([ts[events.kind_rows(Kind.PYTHON_FUNCTION)], dropped_starts(span.header)]), kind="stable")
    thinning = span.header.get(HEADER_KEY)
    thinned = _thinning_fields(span.name, thinning) if isinstance(thinning, dict) else {}
    return ProfilerOverhead(
        **thinned,
        python_events_per_step=_count_in(parts, python_ts, steps),
        ops_per_step=_count_in(parts, np.sort(ts[events.kind_rows(Kind.CPU_OP)], kind="stable"), steps),
        own_us_per_step=_own_time(span, parts, steps),
        phase_median_us=_phase_medians(span),
        within_clocked_us_per_step=_within_clocked(span, steps),
    )


_CLOCKED_PHASE = {label: phase for phase, label in PHASE_LABELS.items()}


def _is_clocked_label(name: str) -> bool:
    return name in _CLOCKED_PHASE


def _within_clocked(span: SpanInput, steps: int) -> dict[str, float]:
    """Per step, each phase's recorded time inside the ranges the capture's phase clock times (the
    `torchscope:<phase>` labels), keyed "<clocked phase>:<phase>". The clock's time for a label holds
    whatever the trace gives other phases inside it: DDP's all-reduces run inside `loss.backward()`, where
    the trace's partition makes them communication."""
    events = span.events
    annotations = events.kind_rows(Kind.USER_ANNOTATION)
    rows = annotations[events.name_mask(_is_clocked_label, annotations)]
    if rows.size == 0:
        return {}
    label_ids, slot = group_ids(events.name[rows])
    out: dict[str, float] = {}
    for i, label_id in enumerate(label_ids.tolist()):
        clocked = _CLOCKED_PHASE[events.strings[label_id]]
        chosen = rows[slot == i]
        ranges = intervals.union(events.ts_us[chosen], events.ts_us[chosen] + events.dur_us[chosen])
        for phase, part in span.phase_sets.items():
            us = intervals.total_length(intervals.intersect(part, ranges))
            if us > 0:
                out[f"{clocked}:{phase}"] = us / steps
    return out


def _thinning_fields(name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """The section's fields about a trace thinned to its budget, from its header's summary."""

    def number(key: str) -> float:
        value = summary.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0

    return {
        "thinned_traces": [name],
        "python_events_recorded": number("python_events"),
        "python_events_dropped": number("python_events_dropped"),
        "dropped_python_us": number("dropped_us"),
        "kept_python_longer_than_us": number("kept_longer_than_us"),
        "trace_budget_mb": number("budget_mb"),
    }


def _phase_medians(span: SpanInput) -> dict[str, float]:
    """Each host phase's median time per step: one step descheduled on a busy machine moves a 3-step mean
    by a third of the stall, the median not at all."""
    breakdown = span.phase_breakdown
    medians = [median(column) for column in np.asarray(breakdown.per_step_us).T]  # np.median imports numpy.ma
    return {name: float(us) for name, us in zip(breakdown.categories, medians)}


def _reduce(parts: list[Part[Optional[ProfilerOverhead]]]) -> dict[str, Any]:
    return {"measurements.profiler_overhead": merge_sections(parts, ProfilerOverhead)}


OVERHEAD = Analysis(
    name="profiler_overhead",
    extract=extract,
    extract_type=Optional[ProfilerOverhead],
    reduce=_reduce,
    fills=("measurements.profiler_overhead",),
)


def step_times(manifest: dict[str, Any]) -> tuple[list[float], list[float], list[float]]:
    """(unprofiled, profiled, unprofiled fetch) durations in us from a report's manifest summary; empty
    when absent (the fetch list also when it does not pair with the unprofiled steps)."""
    environment = manifest.get("environment")
    times = environment.get("step_times") if isinstance(environment, dict) else None
    if not isinstance(times, dict):
        return [], [], []

    def floats(key: str, low: float) -> list[float]:
        values = times.get(key)
        if not isinstance(values, list):
            return []
        return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= low]

    unprofiled = floats("unprofiled_step_us", 1e-9)
    fetch = floats("unprofiled_fetch_us", 0.0)
    return unprofiled, floats("profiled_step_us", 1e-9), fetch if len(fetch) == len(unprofiled) else []


def phase_times(manifest: dict[str, Any], steps: int) -> dict[str, np.ndarray]:
    """Each phase's time (us) in each of the `steps` unprofiled steps, as the capture's clock timed the phase
    hooks' ranges (``environment.step_times.unprofiled_phase_us``); empty when absent or not paired."""
    environment = manifest.get("environment")
    times = environment.get("step_times") if isinstance(environment, dict) else None
    phases = times.get("unprofiled_phase_us") if isinstance(times, dict) else None
    if not isinstance(phases, dict) or steps == 0:
        return {}
    out: dict[str, np.ndarray] = {}
    for name, values in phases.items():
        if not isinstance(values, list) or len(values) != steps:
            return {}
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
            return {}
        out[str(name)] = np.array(values, dtype=float)
    return out


def correct(report: Report) -> None:
    """Fill the run-level figures of ``report.measurements.profiler_overhead`` (see the module docstring)."""
    section = report.measurements.profiler_overhead
    unprofiled, profiled, fetch = step_times(report.run.manifest)
    section.unprofiled_steps = float(len(unprofiled))
    section.profiled_steps = float(len(profiled))
    if not unprofiled or not profiled:
        section.method = "not_measured"
        return
    section.unprofiled_step_us = median(np.array(unprofiled))
    section.profiled_step_us = median(np.array(profiled))
    overhead = section.profiled_step_us - section.unprofiled_step_us
    phases = {name: section.phase_median_us.get(name, entry.us) for name, entry in report.phases.items()}
    total = sum(phases.values())
    events = sum(
        section.python_events_per_step.get(name, 0.0) + OP_EVENT_WEIGHT * section.ops_per_step.get(name, 0.0)
        for name in phases
    )
    if events and MAX_EVENT_US * events < MAX_OVERHEAD_SHARE_UNSEEN * total:
        # Too few recorded events to have distorted the step: a difference between the recorded and the
        # unprofiled steps is the machine's load changing, not the profiler (e.g. a sleeping __getitem__).
        section.method = "negligible"
        section.corrected_percent = {name: entry.percent for name, entry in report.phases.items()}
        return
    # The clock times DataLoader fetches only: with none timed (a generator's batches), data loading is
    # one of the phases it leaves untimed, and a fetch share of 0 would be wrong.
    if fetch and max(fetch) > 0 and phases.get("data_loading", 0.0) > 0 and total > 0:
        _from_fetch_clock(section, phases, np.array(fetch) / np.array(unprofiled), median(np.array(fetch)))
        clocked = phase_times(report.run.manifest, len(unprofiled))
        if clocked:
            _split_by_phase_clock(section, phases, np.array(unprofiled), np.array(fetch), clocked)
        return
    weights = {
        name: section.python_events_per_step.get(name, 0.0) + OP_EVENT_WEIGHT * section.ops_per_step.get(name, 0.0)
        for name in phases
    }
    weight = sum(weights.values())
    if total <= 0 or weight <= 0 or overhead < MIN_OVERHEAD_SHARE * section.profiled_step_us:
        section.method = "negligible"
        section.corrected_percent = {name: entry.percent for name, entry in report.phases.items()}
        return
    # The trace's mean step may differ from the clock's median: spread the clock's overhead as a share of
    # the step, so the correction scales with the trace's own times.
    share = min(overhead / section.profiled_step_us, 1.0)
    removed = {name: min(share * total * weights[name] / weight, phases[name]) for name in phases}
    corrected = {name: phases[name] - removed[name] for name in phases}
    remaining = sum(corrected.values())
    section.method = "step_clock"
    section.overhead_us_per_step = sum(removed.values())
    section.overhead_us_by_phase = {name: us for name, us in removed.items() if us > 0}
    section.corrected_percent = {name: 100.0 * us / remaining for name, us in corrected.items()} if remaining > 0 else {}
    section.slowdown_by_phase = {
        name: phases[name] / corrected[name] for name in phases if corrected[name] > 0 and phases[name] > 0
    }
    clocked = phase_times(report.run.manifest, len(unprofiled))
    if clocked:  # the compute split from the unprofiled steps' phase clock, not the events' spread
        steps = np.array(unprofiled)
        _split_by_phase_clock(section, phases, steps, np.zeros_like(steps), clocked, measured_data=False)


def _from_fetch_clock(section: ProfilerOverhead, phases: dict[str, float], data_share: np.ndarray, data_us: float) -> None:
    """Shares from the unprofiled steps' own fetch timing: data loading is the median share of the step the
    fetches took. The other phases share the rest in proportion to their recorded time less torchscope's own
    step call and less the recording cost of their events, at the cost per event the data-loading phase
    shows (its recorded time over its unprofiled time, per recorded event) when it holds enough events."""
    share = float(min(max(median(data_share), 0.0), 1.0))
    weights = {
        name: section.python_events_per_step.get(name, 0.0) + OP_EVENT_WEIGHT * section.ops_per_step.get(name, 0.0)
        for name in phases
    }
    recorded_data = phases.get("data_loading", 0.0)
    per_event = 0.0
    if weights.get("data_loading", 0.0) >= MIN_CALIBRATION_EVENTS and recorded_data > data_us:
        per_event = (recorded_data - data_us) / weights["data_loading"]
    rest = {
        name: max(us - section.own_us_per_step.get(name, 0.0) - per_event * weights[name], 0.0)
        for name, us in phases.items()
        if name != "data_loading"
    }
    rest_total = sum(rest.values())
    section.method = "fetch_clock"
    section.corrected_percent = {"data_loading": 100.0 * share} | {
        name: 100.0 * (1.0 - share) * us / rest_total if rest_total > 0 else 0.0 for name, us in rest.items()
    }
    section.slowdown_by_phase = {"data_loading": recorded_data / data_us} if data_us > 0 else {}
    section.slowdown_by_phase |= {name: phases[name] / us for name, us in rest.items() if us > 0 and phases[name] > 0}
    section.overhead_us_by_phase = {"data_loading": max(recorded_data - data_us, 0.0)} | {
        name: phases[name] - us for name, us in rest.items() if phases[name] > us
    }
    section.overhead_us_per_step = sum(section.overhead_us_by_phase.values())


def _split_by_phase_clock(
    section: ProfilerOverhead,
    phases: dict[str, float],
    step_us: np.ndarray,
    fetch_us: np.ndarray,
    clocked: dict[str, np.ndarray],
    measured_data: bool = True,
) -> None:
    """Re-split the compute part of `section.corrected_percent` (already holding the measured data share and
    the event-priced estimate) by the unprofiled phase clock: each timed phase by its median over the
    unprofiled steps; the untimed phases (other, communication) share the median untimed remainder of the
    step in proportion to their estimated shares, plus their part of the clocked phases they were recorded
    inside (`_nested_in_clocked`). All medians over 30 steps, not 3 recorded ones. Without
    a measured data share (`measured_data` False: no fetch clock, method step_clock) data loading is one of
    the untimed phases."""
    estimate = section.corrected_percent
    share = estimate.get("data_loading", 0.0) / 100.0 if measured_data else 0.0
    measured = {"data_loading"} if measured_data else set()
    timed = {name: median(us) for name, us in clocked.items() if name in phases and name not in measured}
    if not timed or sum(timed.values()) <= 0:
        return
    remainder = median(np.maximum(step_us - fetch_us - sum(clocked.values()), 0.0))
    untimed = {name: estimate.get(name, 0.0) for name in phases if name not in timed and name not in measured}
    if any(pct <= 0 and phases[name] > 0 for name, pct in untimed.items()):
        # The events' price took all of a phase's recorded time (a generator's tens of thousands of Python
        # calls, cheaper each than the price assumes): no estimate left to split by, so the recorded times.
        untimed = {name: phases[name] for name in untimed}
    timed, nested = _nested_in_clocked(section.within_clocked_us_per_step, timed, measured)
    # An untimed phase recorded inside a clocked range has its part there (`nested`): only what it recorded
    # outside the clocked ranges shares the untimed remainder.
    within = _within(section.within_clocked_us_per_step)
    inside = {name: sum(us for (_, phase), us in within.items() if phase == name) for name in untimed}
    untimed = {name: pct * _outside_share(phases[name], inside[name]) for name, pct in untimed.items()}
    untimed_total = sum(untimed.values())
    rest = dict(timed)
    rest |= {
        name: (remainder * pct / untimed_total if untimed_total > 0 else 0.0) + nested.get(name, 0.0)
        for name, pct in untimed.items()
    }
    if untimed_total <= 0 and "other" in phases:
        rest["other"] = remainder + nested.get("other", 0.0)
    # The profiler only adds time: an untimed phase keeps no more of the remainder than it recorded. What is
    # left is time the clock's phases leave out and the trace gives them (a closure's loss and zero_grad are
    # the trace's forward, not the clock's): shared by the timed phases in proportion to what the trace
    # holds beyond their clock (in proportion to their clock where none does).
    excess = sum(max(rest[name] - phases[name], 0.0) for name in untimed if name in rest)
    if excess > 0:
        rest |= {name: min(rest[name], phases[name]) for name in untimed if name in rest}
        beyond = {name: max(phases[name] - us, 0.0) for name, us in timed.items()}
        weights = beyond if sum(beyond.values()) > 0 else timed
        rest |= {name: us + excess * weights[name] / sum(weights.values()) for name, us in timed.items()}
    total = sum(rest.values())
    section.corrected_percent = ({"data_loading": 100.0 * share} if measured_data else {}) | {
        name: 100.0 * (1.0 - share) * us / total for name, us in rest.items()
    }
    # Each phase's slowdown from the same split (timed ones measured, the untimed ones' remainder shared by
    # estimate), so that the slowdowns and the corrected shares tell one story.
    section.slowdown_by_phase |= {name: phases[name] / us for name, us in rest.items() if us > 0 and phases[name] > 0}
    section.overhead_us_by_phase |= {name: max(phases[name] - us, 0.0) for name, us in rest.items()}
    section.overhead_us_per_step = sum(section.overhead_us_by_phase.values())


def _within(within_us: dict[str, float]) -> dict[tuple[str, str], float]:
    """`within_clocked_us_per_step` by (clocked phase, phase)."""
    out: dict[tuple[str, str], float] = {}
    for key, us in within_us.items():
        clocked, _, phase = key.partition(":")
        if phase:
            out[(clocked, phase)] = us
    return out


def _outside_share(recorded: float, inside: float) -> float:
    return max(recorded - inside, 0.0) / recorded if recorded > 0 else 1.0


def _nested_in_clocked(
    within_us: dict[str, float], timed: dict[str, float], measured: set[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """The clocked phases' medians less what other phases recorded inside their ranges, and those parts
    by phase. The clock's backward holds DDP's all-reduces (the trace's communication): its median is split
    between backward and communication in their recorded proportions inside the backward ranges. Only one
    phase is open at a time, so a clocked phase recorded inside another's range (an optimizer step run by a
    post-accumulate-grad hook inside backward) was timed by that range's clock, not its own: it gets its
    part added. A measured phase's part (a fetch inside a forward, timed by the fetch clock already) is only
    taken off."""
    by_pair = _within(within_us)
    own = dict(timed)
    nested: dict[str, float] = {}
    for clocked, clock_us in timed.items():
        recorded = {phase: us for (name, phase), us in by_pair.items() if name == clocked and us > 0}
        others = {phase: us for phase, us in recorded.items() if phase != clocked}
        total = sum(recorded.values())
        if total <= 0 or not others:
            continue
        for phase, us in others.items():
            part = clock_us * us / total
            own[clocked] -= part
            if phase in timed:
                own[phase] += part
            elif phase not in measured:
                nested[phase] = nested.get(phase, 0.0) + part
    return own, nested
