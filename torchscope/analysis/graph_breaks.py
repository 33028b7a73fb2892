"""torch.compile graph breaks: a compiled call that runs as several graphs, with Python in between.

Where dynamo cannot trace (a data-dependent branch on a tensor's value, `.item()`, `print`, an unsupported
call) it ends the graph, runs the rest as Python and resumes in a new one. Each extra graph costs its
guards, its wrappers and the Python between graphs, and the fusion across the break is lost. In a
training trace each graph's forward is one `CompiledFunction` range (its backward one
`CompiledFunctionBackward`) inside the outermost `Torch-Compiled Region` of the call, so:

* graphs per step: the `CompiledFunction` ranges in the steps; compiled calls: the outermost compiled
  regions (two models compiled apart are two calls of one graph each, no break);
* where the breaks are: with stacks, the frames of dynamo's resume functions
  (`torch_dynamo_resume_in_forward_at_9`: the code after a break in `forward`, line 9);
* the time between graphs: in the compiled regions outside `CompiledFunction`, and in the backward
  phase outside `CompiledFunctionBackward`.

Compiled code without autograd (inference) records no `CompiledFunction`: not measured.
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import FRAME_PATTERN
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids
from torchscope.report.measurements import GraphBreaks
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<func>.+)_at_(?P<line>\d+)$")
MAX_LOCATIONS = 5


def _is_graph(name: str) -> bool:
    return name == "CompiledFunction"


def _is_graph_backward(name: str) -> bool:
    return name == "CompiledFunctionBackward"


def _is_compiled_region(name: str) -> bool:
    return name.startswith("Torch-Compiled Region")


def _is_resume(name: str) -> bool:
    return "torch_dynamo_resume_in_" in name


def break_location(frame: str) -> str:
    """Where a resume function's frame says the graph broke: `forward (train.py:9)`."""
    resume = _RESUME.search(frame)
    match = FRAME_PATTERN.match(frame)
    if resume is None:
        return frame
    file = match["file"].replace("\\", "/").rsplit("/", 1)[-1] if match else "?"
    return f"{resume['func']} ({file}:{resume['line']})"


def graph_breaks(span: SpanInput) -> GraphBreaks | None:
    """Graphs per compiled call, break locations and the time between graphs, per step (None: no compiled
    training graph in the steps)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    n = len(steps)
    windows = intervals.union(steps.start_us, steps.end_us)
    host = events.kind_rows((Kind.CPU_OP, Kind.USER_ANNOTATION))
    graphs = host[events.name_mask(_is_graph, host)]
    graphs = graphs[intervals.contains(windows, events.ts_us[graphs])]
    if graphs.size == 0:
        return None
    regions = _union(events, host[events.name_mask(_is_compiled_region, host)])
    regions = intervals.intersect(regions, windows)
    calls = int(regions[0].size)
    forward_gap = intervals.subtract(regions, _union(events, graphs))
    backward = intervals.subtract(span.phase_sets["backward"], _union(events, host[events.name_mask(_is_graph_backward, host)]))
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    resumes = python[events.name_mask(_is_resume, python)]
    resumes = resumes[intervals.contains(windows, events.ts_us[resumes])]
    return GraphBreaks(
        graphs_per_step=graphs.size / n,
        compiled_calls_per_step=calls / n,
        breaks_per_step=max(graphs.size - calls, 0) / n,
        between_graphs_us_per_step=(intervals.total_length(forward_gap) + intervals.total_length(backward)) / n,
        locations=_locations(events, resumes, n),
    )


def _union(events: EventTable, rows: np.ndarray) -> intervals.IntervalSet:
    return intervals.union(events.ts_us[rows], events.ts_us[rows] + events.dur_us[rows])


def _locations(events: EventTable, rows: np.ndarray, steps: int) -> dict[str, float]:
    """Resume functions by where the graph broke, calls per step, most first."""
    if rows.size == 0:
        return {}
    names, slot = group_ids(events.name[rows])
    counts: dict[str, float] = {}
    for name, count in zip(names.tolist(), np.bincount(slot, minlength=names.size).tolist()):
        where = break_location(events.strings[int(name)])
        counts[where] = counts.get(where, 0.0) + count / steps
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:MAX_LOCATIONS])
