"""The profiler's cost per phase, and the phase shares without it (docs/capture.md, "Measurement that
does not distort").

Recording costs time per recorded event: torch's Python tracer (``with_stack``) adds about a
microsecond to every Python call, and each operator event (with its shapes, stack and memory records)
several. A phase of pure-Python work therefore runs 2-3.5x slower under the profiler while a phase of
long operators runs ~1.0x, and the trace's shares overstate the Python-heavy phases.

Two measurements correct it:

* per span (:func:`extract`): the Python-function and operator events recorded in each host phase, per
  step (an event belongs to the phase whose time holds its start);
* per run (:func:`correct`, after assembly): the capture's own step clock (the manifest's
  ``environment.step_times``: steps the profiler recorded, and steps it did not) gives the overhead per
  step, the difference of the two medians. It is spread over the phases in proportion to their events,
  an operator event weighing :data:`OP_EVENT_WEIGHT` Python events, and each phase's time less its part
  gives the shares without the profiler (``corrected_percent``).

Without unprofiled steps in the manifest (a bare trace, or a schedule with no steps outside the window
after the first) nothing is corrected and ``method`` says so.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.reduce import merge_sections
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.arrays import median
from torchscope.report.measurements import ProfilerOverhead
from torchscope.report.model import Report
from torchscope.trace.kinds import Kind

# What one operator event costs to record, in Python-function events: measured on this project's CPU
# machine (torch 2.13, shapes + memory + stack + FLOPs on) at 3-14 us per operator against 0.4-1.0 us per
# Python call, about 10x in every run of the calibration (docs/capture.md).
OP_EVENT_WEIGHT = 10.0
MIN_OVERHEAD_SHARE = 0.02  # below 2 % of the step the difference of two medians is noise: no correction


def _count_in(parts: dict[str, intervals.IntervalSet], ts: np.ndarray, steps: int) -> dict[str, float]:
    """Events (start times `ts`, sorted) inside each phase's interval set, per step."""
    counts: dict[str, float] = {}
    for name, (starts, ends) in parts.items():
        if starts.size == 0:
            continue
        index = np.searchsorted(starts, ts, side="right") - 1
        inside = (index >= 0) & (ts < ends[np.maximum(index, 0)])
        n = int(np.count_nonzero(inside))
        if n:
            counts[name] = n / steps
    return counts


def extract(span: SpanInput) -> Optional[ProfilerOverhead]:
    """The recorded events per phase and step of one span (None without steps)."""
    steps = len(span.steps)
    if steps == 0:
        return None
    kind = span.events.kind
    ts = span.events.ts_us
    parts = span.phase_sets
    return ProfilerOverhead(
        python_events_per_step=_count_in(parts, np.sort(ts[kind == Kind.PYTHON_FUNCTION]), steps),
        ops_per_step=_count_in(parts, np.sort(ts[kind == Kind.CPU_OP]), steps),
    )


def _reduce(parts: list[Part[Optional[ProfilerOverhead]]]) -> dict[str, Any]:
    return {"measurements.profiler_overhead": merge_sections(parts, ProfilerOverhead)}


OVERHEAD = Analysis(
    name="profiler_overhead",
    extract=extract,
    extract_type=Optional[ProfilerOverhead],
    reduce=_reduce,
    fills=("measurements.profiler_overhead",),
)


def step_times(manifest: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(unprofiled, profiled) step durations in us from a report's manifest summary; empty when absent."""
    environment = manifest.get("environment")
    times = environment.get("step_times") if isinstance(environment, dict) else None
    if not isinstance(times, dict):
        return [], []

    def floats(key: str) -> list[float]:
        values = times.get(key)
        if not isinstance(values, list):
            return []
        return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]

    return floats("unprofiled_step_us"), floats("profiled_step_us")


def correct(report: Report) -> None:
    """Fill the run-level figures of ``report.measurements.profiler_overhead`` (see the module docstring)."""
    section = report.measurements.profiler_overhead
    unprofiled, profiled = step_times(report.run.manifest)
    section.unprofiled_steps = float(len(unprofiled))
    section.profiled_steps = float(len(profiled))
    if not unprofiled or not profiled:
        section.method = "not_measured"
        return
    section.unprofiled_step_us = median(np.array(unprofiled))
    section.profiled_step_us = median(np.array(profiled))
    overhead = section.profiled_step_us - section.unprofiled_step_us
    phases = {name: entry.us for name, entry in report.phases.items()}
    total = sum(phases.values())
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
