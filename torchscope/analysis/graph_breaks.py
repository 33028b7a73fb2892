"""torch.compile graph breaks: a compiled call that runs as several graphs, with Python in between.

Where dynamo cannot trace (a data-dependent branch on a tensor's value, `.item()`, `print`, an unsupported
call) it ends the graph, runs the rest as Python and resumes in a new one. Each extra graph costs its
guards, its wrappers and the Python between graphs, and the fusion across the break is lost. In a
training trace each graph's forward is one `CompiledFunction` range (its backward one
`CompiledFunctionBackward`) inside the outermost `Torch-Compiled Region` of the call, so:

* graphs per step: the `CompiledFunction` ranges in the steps; compiled calls: the forward passes
  (torchscope's labels) that run graphs, and elsewhere the outermost compiled regions that hold one (two
  models compiled apart are two calls of one graph each, no break; a root module's resumed code can run
  outside its first region, so the label is the call where there is one);
* where the breaks are: with stacks, the frames of dynamo's resume functions
  (`torch_dynamo_resume_in_forward_at_9`: the code after a break in `forward`, line 9);
* the time between graphs: in the compiled calls' regions outside the graphs, the backward and optimizer
  phases and compilation, plus in the backward each graph's autograd node outside its compiled backward
  (`evaluate_function: CompiledFunctionBackward` around `CompiledFunctionBackward`: its wrappers; not the
  eager nodes of the rest of the model); on a GPU only where the device idles. The fusion lost across a
  break is not counted.

Under DDP, dynamo's DDPOptimizer splits a compiled model into one graph per gradient bucket on purpose
(`torch._dynamo.config.optimize_ddp`): such splits leave no resume function, so without one the rule
claims no break where DDP's forward ranges are in the trace (`ddp_forwards_per_step`).

Compiled regions without a training graph (a compiled optimizer step, an inference model, a hook dynamo
compiled on its own) are no compiled call of the model: a run compiled for inference only is not measured.
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.compilation import compile_set
from torchscope.analysis.frames import FRAME_PATTERN
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids
from torchscope.report.measurements import GraphBreaks
from torchscope.rundir.labels import PHASE_LABELS
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<func>.+)_at_(?P<line>\d+)$")
MAX_LOCATIONS = 5


def _is_graph(name: str) -> bool:
    return name == "CompiledFunction"


def _is_graph_backward(name: str) -> bool:
    return name == "CompiledFunctionBackward"


def _is_graph_backward_node(name: str) -> bool:
    return name == "autograd::engine::evaluate_function: CompiledFunctionBackward"


def _is_compiled_region(name: str) -> bool:
    return name.startswith("Torch-Compiled Region")


def _is_ddp_forward(name: str) -> bool:
    return name == "DistributedDataParallel.forward"


def _is_forward_label(name: str) -> bool:
    return name == PHASE_LABELS["forward"]


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
    # Compiled calls: the outermost compiled regions that run a training graph. Regions without one (a
    # compiled optimizer step, a no-grad teacher, a hook dynamo compiled on its own) are no call of the model.
    starts, ends = intervals.intersect(_union(events, host[events.name_mask(_is_compiled_region, host)]), windows)
    if starts.size == 0:  # graphs without dynamo's regions (a PyTorch that does not record them): no calls to count
        return None
    graph_start = events.ts_us[graphs]
    region = np.searchsorted(starts, graph_start, side="right") - 1
    held = (region >= 0) & (graph_start < ends[np.maximum(region, 0)])
    calls = np.unique(region[held])
    # A graph's resumed code need not run inside the first graph's region (a root module's loop over
    # blocks that break): one model call is one forward pass, where torchscope labelled them.
    passes = _union(events, host[events.name_mask(_is_forward_label, host)])
    if passes[0].size:
        call_of = np.searchsorted(passes[0], graph_start, side="right") - 1
        in_pass = held & (call_of >= 0) & (graph_start < passes[1][np.maximum(call_of, 0)])
        call_count = np.unique(call_of[in_pass]).size + np.unique(region[held & ~in_pass]).size
    else:
        call_count = calls.size
    # Between graphs: in those regions, outside the graphs, the backward and the optimizer (a compiled
    # training step holds them: they are no break's) and compilation (trace_quality.compilation_in_window's).
    apart = [_union(events, graphs), span.phase_sets["backward"], span.phase_sets["optimizer"],
             compile_set(events)]
    gaps = (starts[calls], ends[calls])
    for interval_set in apart:
        gaps = intervals.subtract(gaps, interval_set)
    # In the backward, each graph's autograd node around its compiled backward (its wrappers), not the
    # eager nodes of the rest of the model.
    nodes = _union(events, host[events.name_mask(_is_graph_backward_node, host)])
    nodes = intervals.subtract(intervals.intersect(nodes, windows), _union(events, host[events.name_mask(_is_graph_backward, host)]))
    gaps = intervals.union(np.concatenate([gaps[0], nodes[0]]), np.concatenate([gaps[1], nodes[1]]))
    if span.has_device:  # host time the device stays busy through costs nothing
        gaps = intervals.subtract(gaps, span.device.busy)
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    resumes = python[events.name_mask(_is_resume, python)]
    resumes = resumes[intervals.contains(windows, events.ts_us[resumes])]
    ddp = host[events.name_mask(_is_ddp_forward, host)]
    return GraphBreaks(
        ddp_forwards_per_step=float(intervals.contains(windows, events.ts_us[ddp]).sum()) / n,
        graphs_per_step=int(held.sum()) / n,
        compiled_calls_per_step=call_count / n,
        breaks_per_step=max(int(held.sum()) - call_count, 0) / n,
        between_graphs_us_per_step=intervals.total_length(gaps) / n,
        locations=_locations(events, resumes, n),
        time_base="device_idle" if span.has_device else "host",
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
