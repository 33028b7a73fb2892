"""torch.compile in a trace: the compiled calls, the time spent compiling, and which compilations were
recompilations of a frame compiled before.

What dynamo and Inductor leave in a Kineto trace (PyTorch 2.x):

* each call of compiled code is a `Torch-Compiled Region: F/R` range (older releases: `TorchDynamo Cache
  Lookup`, then the graph's `CompiledFunction`); `F/R` is the compile id of the graph that ran: frame F's
  R-th compilation;
* compiling is a nest of record_function ranges: `dynamo` and `entire_frame_compile` around a frame's
  compilation, `entire_backward_compile` around AOTAutograd's backward, compiled lazily inside the first
  backward that needs it, and `<phase> (dynamo_timed)` ranges inside them (`compile_inner` in older
  releases). They nest, so the time compiling is the union of their intervals, never their sum;
* `<phase>_data: ..., compile_id=F/R` annotations inside them name the compilation's id (recent releases;
  without them, the first `Torch-Compiled Region: F/R` of an id after a compilation names it). R >= 1 is a
  *recompilation*: a guard of frame F's earlier graphs failed (an input of a new shape, dtype or device, a
  changed Python value), and dynamo compiled another graph;
* compiled autograd captures each new backward graph in a `compiled_autograd` range, its ids `!A` and the
  graph's compilation `!A/F/0` (a new frame every time): its A-th capture (A >= 1) is the recompilation.

A recompilation in the steady state (every step, or every other) costs a compilation per step, and after
`torch._dynamo.config.recompile_limit` (8) of them dynamo stops compiling the frame and runs it eagerly.
When the graphs' inputs were recorded (`CompiledFunction`'s input shapes), the dimensions that differ
between a frame's graphs name the usual cause: a shape that changes from step to step.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import HOST_RANGES, named_rows
from torchscope.analysis.patterns import input_shapes
from torchscope.analysis.steps import StepWindows, event_steps
from torchscope.arrays import group_ids, read_only
from torchscope.report.measurements import Compile
from torchscope.trace.tables import EventTable

# Dynamo's outer phases (log_event_start), around the `(dynamo_timed)` ranges they hold.
_PHASES = frozenset({"dynamo", "entire_frame_compile", "entire_backward_compile", "compiled_autograd"})
_COMPILE_ID = re.compile(r"compile_id=(?P<id>!?[0-9/]+)")
COMPILED_AUTOGRAD = "compiled autograd"  # the "frame" of every compiled autograd id
_REGION = "Torch-Compiled Region"
# One of these per call of compiled code, by PyTorch release: the first family found is counted.
_CALL_MARKERS = (_REGION, "TorchDynamo Cache Lookup", "CompiledFunction")
MAX_IDS = 8  # recompiled ids and varying inputs listed in the report


def is_compile_range(name: str) -> bool:
    """A range dynamo or Inductor records while compiling (they nest: take their union)."""
    return "(dynamo_timed)" in name or name.startswith("compile_inner") or name in _PHASES


def _is_compile_data(name: str) -> bool:
    return "_data: " in name and "compile_id=" in name


def _is_graph(name: str) -> bool:
    return name == "CompiledFunction"


def _is_region(name: str) -> bool:
    return name.startswith(_REGION)


def compile_set(events: EventTable) -> intervals.IntervalSet:
    """When the process was compiling, as one interval set (once per table; read-only). Other analyses
    leave what runs inside it to compilation: dynamo's own garbage collections, AOTAutograd's stack captures
    while it traces the backward."""

    def compute() -> intervals.IntervalSet:
        rows = _rows(events, is_compile_range)
        start = events.ts_us[rows]
        found = intervals.union(start, start + events.dur_us[rows])
        return read_only(found[0]), read_only(found[1])

    return events.memo("compilation.compile_set", compute)


def inside_compilation(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: whether the event starts while the process was compiling."""
    return intervals.contains(compile_set(events), events.ts_us[rows])


def frame_and_count(compile_id: str) -> tuple[str, int] | None:
    """(frame, compilation count) of a compile id: ("F", R) of "F/R"; compiled autograd's "!A" and "!A/F/R"
    are its A-th backward graph, ("compiled autograd", A); None for text that is no compile id."""
    parts = compile_id.lstrip("!").split("/")
    if not all(p.isdigit() for p in parts) or not parts[0]:
        return None
    if compile_id.startswith("!"):
        return COMPILED_AUTOGRAD, int(parts[0])
    return ("/".join(parts[:-1]), int(parts[-1])) if len(parts) >= 2 else None


def compile_activity(events: EventTable, steps: StepWindows, compute: intervals.IntervalSet = intervals.EMPTY) -> Compile:
    """Compiled calls and compilation inside the steps, per step (of it, the part inside `compute`: the
    forward and backward phases); which of the compilations were recompilations, in how many of the steps,
    and the graph inputs whose shape differs between a recompiled frame's graphs."""
    n = len(steps)
    if n == 0:
        return Compile()
    windows = intervals.union(steps.start_us, steps.end_us)
    markers = _rows(events, _is_call_marker)
    markers = markers[event_steps(events, steps)[markers] >= 0]  # compiled calls and graphs in the steps
    compiling = intervals.intersect(compile_set(events), windows)
    out = Compile(
        compiled_regions_per_step=_calls(events, markers) / n,
        compilation_us_per_step=intervals.total_length(compiling) / n,
        compilation_in_compute_us_per_step=intervals.total_length(intervals.intersect(compiling, compute)) / n,
    )
    if compiling[0].size == 0:
        return out
    interval, ids = _named_compilations(events, compiling)
    if ids.size == 0:
        return out
    counted = [frame_and_count(str(i)) for i in ids.tolist()]
    again = np.array([c is not None and c[1] >= 1 for c in counted], dtype=bool)
    # An interval is a recompilation's when every id named in it is one.
    first = np.zeros(compiling[0].size, dtype=bool)
    first[interval[~again]] = True
    named = np.zeros(compiling[0].size, dtype=bool)
    named[interval] = True
    recompiling = named & ~first
    recompiling_step = steps.index_of(compiling[0][recompiling])
    # One per (frame, count), named by its shortest id: compiled autograd's capture !A and the compilation of
    # its graph, !A/F/0, are one recompilation.
    by_key: dict[tuple[str, int], str] = {}
    for compile_id, key in zip(ids.tolist(), counted):
        if key is not None and key[1] >= 1:
            by_key[key] = min(by_key.get(key, compile_id), compile_id, key=len)
    recompiled = sorted(by_key.values(), key=_id_order)
    out.recompilations_per_step = len(recompiled) / n
    out.recompilation_us_per_step = float((compiling[1] - compiling[0])[recompiling].sum()) / n
    out.recompiling_steps_share = np.unique(recompiling_step[recompiling_step >= 0]).size / n
    out.recompiled_ids = recompiled[:MAX_IDS]
    frames = {frame for frame, _ in (frame_and_count(i) or ("", 0) for i in recompiled) if frame}
    out.varying_inputs = _varying_inputs(events, markers, frames)[:MAX_IDS]
    return out


def _named_compilations(events: EventTable, compiling: intervals.IntervalSet) -> tuple[np.ndarray, np.ndarray]:
    """(interval, compile id) pairs: the ids dynamo's `_data` annotations name inside each compiling
    interval; where a release writes none, the id of the first region of a new id after the interval."""
    data = _rows(events, _is_compile_data)
    if data.size:
        starts, texts = events.ts_us[data], events.text(events.name[data])
        ids = np.array([_compile_id(t) for t in texts], dtype=object)
    else:
        regions = _rows(events, _is_region)
        regions = regions[np.argsort(events.ts_us[regions], kind="stable")]
        names, slot = group_ids(events.name[regions])
        new = np.zeros(regions.size, dtype=bool)
        new[np.unique(slot, return_index=True)[1]] = True  # each id's first call: right after it compiled
        regions = regions[new]
        ends = compiling[1]
        # The interval each new region follows: the last one ending at or before the region starts.
        after = np.searchsorted(ends, events.ts_us[regions], side="right") - 1
        keep = after >= 0
        interval = after[keep]
        ids = np.array([t[len(_REGION) :].strip(": ") for t in events.text(events.name[regions[keep]])], dtype=object)
        # Only the first new region after an interval is its compilation's.
        _, firsts = np.unique(interval, return_index=True)
        return interval[firsts], ids[firsts]
    interval = np.searchsorted(compiling[0], starts, side="right") - 1
    inside = (interval >= 0) & (starts < compiling[1][np.maximum(interval, 0)])
    return interval[inside], ids[inside]


def _calls(events: EventTable, markers: np.ndarray) -> int:
    """Calls of compiled code: the outermost ranges of the first marker family found (a graph break's resumed
    frame runs its own region inside the caller's)."""
    if markers.size == 0:
        return 0
    names, slot = group_ids(events.name[markers])
    family = np.array([_family(events.strings[i]) for i in names.tolist()])[slot]
    found = markers[family == family.min()]
    start = events.ts_us[found]
    return int(intervals.union(start, start + events.dur_us[found])[0].size)


def _family(name: str) -> int:
    return next(i for i, marker in enumerate(_CALL_MARKERS) if name.startswith(marker))


def _is_call_marker(name: str) -> bool:
    return name.startswith(_CALL_MARKERS)


def _rows(events: EventTable, predicate: Callable[[str], bool]) -> np.ndarray:
    """The host ranges (ops, annotations) named so: a whole-table mask, the predicate asked per distinct name."""
    return named_rows(events, predicate, HOST_RANGES)


def _compile_id(name: str) -> str:
    match = _COMPILE_ID.search(name)
    return match["id"] if match else ""


def _id_order(compile_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in compile_id.lstrip("!").split("/") if p.isdigit())


def _varying_inputs(events: EventTable, rows: np.ndarray, frames: set[str]) -> list[str]:
    """For each recompiled frame, the graph inputs (recorded `CompiledFunction` input shapes) whose
    dimensions differ between the frame's graphs that ran in the steps: "frame 0, input 0 dim 1: 49, 65, 81".
    Only graphs with the frame's most common input count are compared (an added size argument shifts them)."""
    if not frames:
        return []
    regions = rows[events.name_mask(_is_region, rows)]
    graphs = rows[events.name_mask(_is_graph, rows)]
    if regions.size == 0 or graphs.size == 0:
        return []
    shapes: dict[str, dict[int, list[list[int]]]] = {}
    region_thread, graph_thread = events.thread_keys(regions), events.thread_keys(graphs)
    for thread in np.unique(graph_thread).tolist():
        mine = regions[region_thread == thread]
        mine = mine[np.argsort(events.ts_us[mine], kind="stable")]
        own = graphs[graph_thread == thread]
        # Each graph's region: the last one of its thread starting before it, if it has not ended.
        at = np.searchsorted(events.ts_us[mine], events.ts_us[own], side="right") - 1
        held = (at >= 0) & (events.ts_us[own] <= (events.ts_us + events.dur_us)[mine[np.maximum(at, 0)]])
        for region, dims in zip(events.text(events.name[mine[at[held]]]), events.text(events.input_dims[own[held]])):
            counted = frame_and_count(region[len(_REGION) :].strip(": "))
            parsed = input_shapes(dims)
            if counted is not None and counted[0] in frames and parsed is not None:
                shapes.setdefault(counted[0], {}).setdefault(counted[1], parsed)
    found: list[str] = []
    for frame, by_count in sorted(shapes.items()):
        ordered = [by_count[r] for r in sorted(by_count)]
        counts = [len(d) for d in ordered]
        usual = max(set(counts), key=counts.count)  # a static first graph may lack the dynamic ones' size inputs
        graphs_dims = [d for d in ordered if len(d) == usual]
        where = COMPILED_AUTOGRAD if frame == COMPILED_AUTOGRAD else f"frame {frame}"
        for index in range(len(graphs_dims[0])):
            shapes_of = [d[index] for d in graphs_dims]
            if len({len(s) for s in shapes_of}) > 1:
                continue  # a different rank: not one dimension that varies
            for dim in range(len(shapes_of[0])):
                values = list(dict.fromkeys(s[dim] for s in shapes_of))
                if len(values) > 1:
                    found.append(f"{where}, input {index} dim {dim}: {', '.join(str(v) for v in values)}")
    return found
