"""Python's garbage collections inside the steps, from the "Python GC" events torch's Python tracer records
with `_ExperimentalConfig(record_python_gc_info=True)` (the capture turns it on with stacks).

A collection stops the thread that triggered it: a young-generation one takes microseconds, a full one walks
every tracked object the process holds (hundreds of milliseconds with millions of them: a dataset index or a
cache of Python dicts). Inside a step it is host time like any other: on a GPU the launches wait for it.
"""

from __future__ import annotations

import numpy as np

from typing import Any

from torchscope.analysis.compilation import inside_compilation
from torchscope.analysis.nesting import HostTree
from torchscope.analysis.steps import StepWindows, event_steps
from torchscope.report.measurements import GarbageCollection
from torchscope.report.model import Report
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

LONG_PAUSE_US = 1000.0  # MSPROF gc.yaml: a GC event over 1000 us


def is_gc_event(name: str) -> bool:
    """A collection as torch's Python tracer records it (`record_python_gc_info`)."""
    return name == "Python GC"


def _is_collect_call(name: str) -> bool:
    return name == "<built-in function collect>"


def garbage_collection(events: EventTable, steps: StepWindows, tree: HostTree) -> GarbageCollection | None:
    """The collections inside the steps and outside compilation, per step (None: no GC event in the trace: not
    recorded, or none)."""
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    rows = python[events.name_mask(is_gc_event, python)]
    if rows.size == 0 or len(steps) == 0:
        return None
    rows = rows[event_steps(events, steps)[rows] >= 0]
    # Dynamo's collections while it compiles (it calls gc.collect itself) are compilation's cost, counted there.
    rows = rows[~inside_compilation(events, rows)]
    n = len(steps)
    pauses = events.dur_us[rows]
    parent = tree.parent[rows]
    explicit = (parent >= 0) & events.name_mask(_is_collect_call, np.maximum(parent, 0))  # the script's gc.collect()
    return GarbageCollection(
        collections_per_step=float(rows.size / n),
        explicit_collections_per_step=float(np.count_nonzero(explicit) / n),
        gc_us_per_step=float(pauses.sum() / n),
        long_pauses_per_step=float(np.count_nonzero(pauses >= LONG_PAUSE_US) / n),
        longest_pause_us=float(pauses.max()) if pauses.size else 0.0,
    )


def from_step_clock(report: Report) -> None:
    """Fill the run-level `unprofiled_*` figures of `report.measurements.gc` from the capture's clock
    (the manifest's `environment.step_times`: each unprofiled step's collections, capture/gc_timer.py);
    left at 0 steps when the capture did not time them (a bare trace, an older capture)."""
    environment = report.run.manifest.get("environment")
    times = environment.get("step_times") if isinstance(environment, dict) else None
    if not isinstance(times, dict):
        return
    steps, gc_us, full_us = (_numbers(times.get(key)) for key in ("unprofiled_step_us", "unprofiled_gc_us", "unprofiled_full_gc_us"))
    if not steps or len(gc_us) != len(steps) or len(full_us) != len(steps):
        return
    section = report.measurements.gc
    n = len(steps)
    section.unprofiled_steps = float(n)
    section.unprofiled_step_mean_us = sum(steps) / n
    section.unprofiled_gc_us_per_step = sum(gc_us) / n
    section.unprofiled_full_gc_us_per_step = sum(full_us) / n
    section.unprofiled_collections_per_step = _number(times.get("unprofiled_gc_collections")) / n
    section.unprofiled_longest_pause_us = _number(times.get("gc_longest_pause_us"))


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, list) or not all(_is_number(v) and v >= 0 for v in values):
        return []
    return [float(v) for v in values]


def _number(value: Any) -> float:
    return float(value) if _is_number(value) and value >= 0 else 0.0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
