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
* `<phase>_data: ..., compile_id=F/R` annotations inside them name the compilation's id. R >= 1 is a
  *recompilation*: a guard of frame F's earlier graphs failed (an input of a new shape, dtype or device, a
  changed Python value), and dynamo compiled another graph. Compiled autograd's ids start with `!`.

A recompilation in the steady state (every step, or every other) costs a compilation per step, and after
`torch._dynamo.config.recompile_limit` (8) of them dynamo stops compiling the frame and runs it eagerly.
When the graphs' inputs were recorded (`CompiledFunction`'s input shapes), the dimensions that differ
between a frame's graphs name the usual cause: a shape that changes from step to step.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.steps import StepWindows, event_steps
from torchscope.arrays import group_ids, read_only
from torchscope.report.measurements import Compile
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

HOST_RANGES = (Kind.CPU_OP, Kind.USER_ANNOTATION)
# Dynamo's outer phases (log_event_start), around the `(dynamo_timed)` ranges they hold.
_PHASES = frozenset({"dynamo", "entire_frame_compile", "entire_backward_compile"})
_COMPILE_ID = re.compile(r"compile_id=(?P<id>!?[0-9/]+)")
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
        host = events.kind_rows(HOST_RANGES)
        rows = host[events.name_mask(is_compile_range, host)]
        start = events.ts_us[rows]
        found = intervals.union(start, start + events.dur_us[rows])
        return read_only(found[0]), read_only(found[1])

    return events.memo("compilation.compile_set", compute)


def inside_compilation(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: whether the event starts while the process was compiling."""
    return intervals.contains(compile_set(events), events.ts_us[rows])


def frame_and_count(compile_id: str) -> tuple[str, int] | None:
    """("F", R) of a compile id "F/R" (or compiled autograd's "!A/F/R"); None for one without a frame."""
    parts = compile_id.lstrip("!").split("/")
    if len(parts) < 2 or not parts[-1].isdigit():
        return None
    return "/".join(parts[:-1]), int(parts[-1])


def compile_activity(events: EventTable, steps: StepWindows) -> Compile:
    """Compiled calls and compilation inside the steps, per step; which of the compilations were
    recompilations, in how many of the steps, and the graph inputs whose shape differs between a recompiled
    frame's graphs."""
    n = len(steps)
    if n == 0:
        return Compile()
    windows = intervals.union(steps.start_us, steps.end_us)
    host = events.kind_rows(HOST_RANGES)
    in_steps = host[event_steps(events, steps)[host] >= 0]
    compiling = intervals.intersect(compile_set(events), windows)
    out = Compile(
        compiled_regions_per_step=_calls(events, in_steps) / n,
        compilation_us_per_step=intervals.total_length(compiling) / n,
    )
    # The compile ids named inside each compiling interval of the steps.
    data = in_steps[events.name_mask(_is_compile_data, in_steps)]
    if data.size == 0 or compiling[0].size == 0:
        return out
    names, slot = group_ids(events.name[data])
    ids = np.array([_compile_id(events.strings[i]) for i in names.tolist()], dtype=object)[slot]
    interval = np.searchsorted(compiling[0], events.ts_us[data], side="right") - 1
    inside = (interval >= 0) & (events.ts_us[data] < compiling[1][np.maximum(interval, 0)])
    ids, interval = ids[inside], interval[inside]
    counted = [frame_and_count(str(i)) for i in ids.tolist()]
    again = np.array([c is not None and c[1] >= 1 for c in counted], dtype=bool)
    # An interval is a recompilation's when every id named in it is one.
    first = np.zeros(compiling[0].size, dtype=bool)
    first[interval[~again]] = True
    named = np.zeros(compiling[0].size, dtype=bool)
    named[interval] = True
    recompiling = named & ~first
    step_of = steps.index_of(compiling[0][recompiling])
    recompiled = sorted({str(i) for i in ids[again].tolist()}, key=_id_order)
    out.recompilations_per_step = len(recompiled) / n
    out.recompilation_us_per_step = float((compiling[1] - compiling[0])[recompiling].sum()) / n
    out.recompiling_steps_share = np.unique(step_of[step_of >= 0]).size / n
    out.recompiled_ids = recompiled[:MAX_IDS]
    frames = {frame for frame, _ in (frame_and_count(i) or ("", 0) for i in recompiled) if frame}
    out.varying_inputs = _varying_inputs(events, in_steps, frames)[:MAX_IDS]
    return out


def _calls(events: EventTable, rows: np.ndarray) -> int:
    for marker in _CALL_MARKERS:
        count = int(np.count_nonzero(events.name_mask(lambda s, m=marker: s.startswith(m), rows)))
        if count:
            return count
    return 0


def _compile_id(name: str) -> str:
    match = _COMPILE_ID.search(name)
    return match["id"] if match else ""


def _id_order(compile_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in compile_id.lstrip("!").split("/") if p.isdigit())


def _varying_inputs(events: EventTable, rows: np.ndarray, frames: set[str]) -> list[str]:
    """For each recompiled frame, the graph inputs (recorded `CompiledFunction` input shapes) whose
    dimensions differ between the frame's graphs that ran in the steps: "frame 0, input 0 dim 1: 49, 65, 81"."""
    if not frames:
        return []
    regions = rows[events.name_mask(_is_region, rows)]
    graphs = rows[events.name_mask(_is_graph, rows)]
    if regions.size == 0 or graphs.size == 0:
        return []
    # Each graph's region: the last region starting before it on its thread that has not ended.
    order = np.argsort(events.ts_us[regions], kind="stable")
    regions = regions[order]
    at = np.searchsorted(events.ts_us[regions], events.ts_us[graphs], side="right") - 1
    held = (at >= 0) & (events.ts_us[graphs] <= (events.ts_us + events.dur_us)[regions[np.maximum(at, 0)]])
    shapes: dict[str, dict[int, list[list[int]]]] = {}
    for region, dims in zip(events.text(events.name[regions[at[held]]]), events.text(events.input_dims[graphs[held]])):
        counted = frame_and_count(region[len(_REGION) :].strip(": "))
        parsed = _dims(dims)
        if counted is None or counted[0] not in frames or parsed is None:
            continue
        shapes.setdefault(counted[0], {}).setdefault(counted[1], parsed)
    found: list[str] = []
    for frame, by_count in sorted(shapes.items()):
        graphs_dims = [by_count[r] for r in sorted(by_count)]
        for index in range(min(len(d) for d in graphs_dims)):
            shapes_of = [d[index] for d in graphs_dims]
            if len({len(s) for s in shapes_of}) > 1:
                continue  # a different rank: not one dimension that varies
            for dim in range(len(shapes_of[0])):
                values = list(dict.fromkeys(s[dim] for s in shapes_of))
                if len(values) > 1:
                    found.append(f"frame {frame}, input {index} dim {dim}: {', '.join(str(v) for v in values)}")
    return found


def _dims(text: str) -> list[list[int]] | None:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    if not isinstance(value, list):
        return None
    return [[int(d) for d in s] if isinstance(s, list) and all(isinstance(d, int) for d in s) else [] for s in value]
