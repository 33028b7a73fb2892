"""Host call trees: the vectorised parent/depth computation equals a plain stack walk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.nesting import _thread_tree, accumulate_up, build_host_tree, operator_parent, self_time_us, tree_order
from torchscope.trace.kinds import Kind
from torchscope.trace.parse import parse_trace_bytes


def _stack_reference(ts: np.ndarray, dur: np.ndarray) -> tuple[list[int], list[int]]:
    stack: list[int] = []
    parents, depths = [], []
    for i, start in enumerate(ts):
        while stack and ts[stack[-1]] + dur[stack[-1]] <= start:
            stack.pop()
        parents.append(stack[-1] if stack else -1)
        depths.append(len(stack))
        stack.append(i)
    return parents, depths


@st.composite
def nested_events(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Properly nested intervals (including zero-length ones and shared start times)."""
    events: list[tuple[int, int]] = []

    def fill(lo: int, hi: int, depth: int) -> None:
        t = lo
        for _ in range(draw(st.integers(0, 4))):
            start = t + draw(st.integers(0, 2))
            end = min(hi, start + draw(st.integers(0, 8)))
            if end < start:
                return
            events.append((start, end - start))
            if depth < 4 and end - start > 1:
                fill(start, end, depth + 1)
            t = end + draw(st.integers(0, 1))

    fill(0, 100, 0)
    return sorted(events, key=lambda e: (e[0], -e[1]))


@settings(max_examples=300, deadline=None)
@given(nested_events())
def test_vectorised_tree_equals_stack_walk(events: list[tuple[int, int]]) -> None:
    ts = np.array([e[0] for e in events], dtype=float)
    dur = np.array([e[1] for e in events], dtype=float)
    parent, depth = _thread_tree(ts, dur)
    ref_parent, ref_depth = _stack_reference(ts, dur)
    assert parent.tolist() == ref_parent
    assert depth.tolist() == ref_depth


def test_self_time_and_inclusive_totals_on_a_built_trace() -> None:
    builder = TraceBuilder()
    builder.op("outer", 0, 100)
    builder.op("inner_a", 10, 30)
    builder.op("leaf", 15, 5)
    builder.op("inner_b", 50, 20)
    builder.op("other_thread", 0, 100, tid=2)
    table = parse_trace_bytes(json.dumps(builder.document()).encode()).events
    tree = build_host_tree(table)
    names = table.text(table.name)
    self_time = dict(zip(names, self_time_us(table.dur_us, tree.parent, np.ones(len(table), dtype=bool))))
    assert self_time == {"outer": 50, "inner_a": 25, "leaf": 5, "inner_b": 20, "other_thread": 100}
    totals = dict(zip(names, accumulate_up(tree, np.ones(len(table)))))
    assert totals["outer"] == 4 and totals["inner_a"] == 2 and totals["other_thread"] == 1


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 4)), min_size=1, max_size=80),
       st.sampled_from(["as given", "by start", "with NaN starts"]))
def test_tree_order_is_lexsorts_order(events: list[tuple[int, int, int]], layout: str) -> None:
    """Thread, then start, then longer first, ties in input order: exactly np.lexsort's order, on its
    fast path (few tied starts) and its fallbacks (many ties; NaN starts, which tie in lexsort)."""
    if layout == "by start":
        events = sorted(events, key=lambda e: e[1])
    thread, ts, dur = (np.array(column, dtype=dtype) for column, dtype in zip(zip(*events), (np.int64, float, float)))
    if layout == "with NaN starts":
        ts[::3] = np.nan
    assert np.array_equal(tree_order(thread, ts, dur), np.lexsort((-dur, ts, thread)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 30)), min_size=1, max_size=60))
def test_every_parent_is_open_when_its_child_starts_even_when_events_overlap(events: list[tuple[int, int]]) -> None:
    # Real Python-tracer traces overlap without nesting (an nn.Module range ends a microsecond before the
    # op it called): the level count once named an event that had already ended as the parent.
    events = sorted(events, key=lambda e: (e[0], -e[1]))
    ts = np.array([e[0] for e in events], dtype=float)
    dur = np.array([e[1] for e in events], dtype=float)
    parent, depth = _thread_tree(ts, dur)
    has = parent >= 0
    assert (ts[parent[has]] + dur[parent[has]] >= ts[has]).all()
    assert (depth[parent[has]] < depth[has]).all()  # the level-by-level passes need parents above


def test_a_child_of_a_range_that_closed_early_goes_to_the_open_ancestor() -> None:
    # step [0, 100) > module [10, 30) and op [12, 32) (ends after the module); then call [31, 35).
    ts = np.array([0.0, 10.0, 12.0, 31.0])
    dur = np.array([100.0, 20.0, 20.0, 4.0])
    parent, _ = _thread_tree(ts, dur)
    assert parent.tolist()[:3] == [-1, 0, 1]
    assert parent[3] in (0, 2)  # open at 31: the step, or the op still running; never the closed module


@settings(max_examples=200, deadline=None)
@given(nested_events(), st.randoms(use_true_random=False))
def test_inclusive_totals_and_inherited_labels_equal_a_walk_up_the_parents(events: list[tuple[int, int]], rng) -> None:
    """`accumulate_up` sums each event's descendants (bit for bit as summing each parent's children in
    their order), `nearest_ancestor_of` finds the nearest marked ancestor-or-self; the events are shuffled,
    so siblings and parents come in any order of the table, as Kineto writes them (by end, not start)."""
    from torchscope.analysis.nesting import HostTree, nearest_ancestor_of

    assume(events)
    order = list(range(len(events)))
    rng.shuffle(order)
    builder = TraceBuilder()
    for i in order:
        builder.op(f"op{i}", events[i][0], events[i][1])
    table = parse_trace_bytes(json.dumps(builder.document()).encode()).events
    tree: HostTree = build_host_tree(table)
    values = np.array([rng.random() for _ in range(len(table))])
    expected = values.copy()
    for level in reversed(tree.levels[1:]):  # the plain grouping: parents sorted, children summed in order
        level = level[tree.parent[level] >= 0]
        parents, slot = np.unique(tree.parent[level], return_inverse=True)
        expected[parents] += np.bincount(slot, weights=expected[level], minlength=parents.size)
    assert accumulate_up(tree, values).tobytes() == expected.tobytes()
    marked = np.array([rng.random() < 0.3 for _ in range(len(table))], dtype=bool)
    nearest = nearest_ancestor_of(tree, marked)
    for event in range(len(table)):
        walk = event
        while walk >= 0 and not marked[walk]:
            walk = int(tree.parent[walk])
        assert nearest[event] == walk


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=120))
def test_parents_level_by_level_equal_one_search(depths: list[int]) -> None:
    """The level-by-level search (real traces) and the single search (very deep ones) name the same
    parents, for any depths, levels skipped included (overlapping, not nested, events)."""
    from torchscope.analysis.nesting import _level_parents, _parents_in_one_search

    depth = np.array(depths)
    assert _level_parents(depth).tolist() == _parents_in_one_search(depth).tolist()


def test_launchers_of_the_device_rows_are_kept_and_equal_any_subset() -> None:
    from torchscope.analysis.nesting import launcher_of_device_events
    from torchscope.trace.kinds import DEVICE_KINDS

    builder = TraceBuilder()
    builder.launch(0, 5, 10, 3)
    builder.launch(6, 5, 20, 3, name="Memcpy HtoD", runtime="cudaMemcpyAsync", cat="gpu_memcpy")
    builder.launch(12, 5, 30, 3)
    table = parse_trace_bytes(json.dumps(builder.document()).encode()).events
    device = table.kind_rows(DEVICE_KINDS)
    launcher = launcher_of_device_events(table, device)
    assert launcher_of_device_events(table, device.copy()) is launcher  # kept for the same rows
    assert not launcher.flags.writeable
    assert list(table.text(table.name[launcher])) == ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernel"]
    part = device[[0, 2]]
    assert np.array_equal(launcher_of_device_events(table, part), launcher[[0, 2]])


def test_record_function_ranges_nest_beside_the_calls_that_opened_them() -> None:
    """As PyTorch 2.x traces with stacks write them: `ProfilerStep#1` opens inside the previous step's
    `step()` calls and a user's `record_function("augment")` inside its `__enter__` chain, each outliving
    the calls; `__exit__` starts inside the range and ends just after it. The ranges hold what runs in them."""
    b = TraceBuilder()
    frame = "python_function"
    b.op("train.py(10): <module>", 0, 10_000, cat=frame)
    b.op("torchscope/capture/profiler.py(231): step", 10, 60, cat=frame)
    b.op("torch/profiler/profiler.py(1150): step", 20, 49.8, cat=frame)
    b.op("torch/autograd/profiler.py(918): __enter__", 60, 9.9, cat=frame)  # ends 0.1 us after its caller
    b.op("<built-in method _record_function_enter_new of PyCapsule object at 0x7f00>", 62, 6, cat=frame)
    b.annotation("ProfilerStep#1", 65, 5000)
    b.op("torch/autograd/profiler.py(918): __enter__", 100, 10, cat=frame)
    b.op("torch/_ops.py(1267): __call__", 102, 7, cat=frame)
    b.op("<built-in method _record_function_enter_new of PyCapsule object at 0x7f00>", 104, 4, cat=frame)
    b.annotation("augment", 106, 3000)
    b.op("<built-in function sleep>", 200, 2500, cat=frame)
    b.op("aten::randn", 2800, 100)
    b.op("torch/autograd/profiler.py(932): __exit__", 3090, 30, cat=frame)
    b.op("train.py(20): log", 3200, 500, cat=frame)
    events = parse_trace_bytes(json.dumps(b.document()).encode()).events
    tree = build_host_tree(events)
    row = {events.strings[n]: i for i, n in enumerate(events.name.tolist())}

    def parent_of(name: str) -> str | None:
        p = int(tree.parent[row[name]])
        return None if p < 0 else events.strings[int(events.name[p])]

    assert parent_of("ProfilerStep#1") == "train.py(10): <module>"
    assert parent_of("augment") == "ProfilerStep#1"
    assert parent_of("<built-in function sleep>") == "augment"
    assert parent_of("aten::randn") == "augment"
    assert parent_of("train.py(20): log") == "ProfilerStep#1"
    assert parent_of("torch/autograd/profiler.py(932): __exit__") == "augment"  # ends 14 us after it: kept inside
    self_us = self_time_us(events.dur_us, tree.parent, np.ones(len(events), dtype=bool))
    assert self_us[row["augment"]] == 3000 - 2500 - 100 - 30


def test_operators_count_their_children_through_python_frames(tmp_path: Path) -> None:
    """With stacks on, Python frames sit between an operator that runs Python (a compiled graph's
    `CompiledFunction`) and the operators it calls: `operator_parent` nests the operators past them (it is
    no leaf), and its self time leaves out the frames, as in PyTorch's own operator tables."""
    frame = "python_function"
    b = TraceBuilder()
    b.op("train.py(12): <module>", 0, 1000, cat=frame)
    b.step(1, 5, 990)
    b.op("CompiledFunction", 10, 900)
    b.op("torch/_functorch/_aot_autograd/runtime_wrappers.py(310): runtime_wrapper", 12, 890, cat=frame)
    b.annotation("## Call CompiledFxGraph abc ##", 20, 870)
    b.op("/tmp/torchinductor_root/ab/cabc.py(120): call", 22, 860, cat=frame)
    b.op("aten::mm", 30, 500)
    b.op("aten::addmm", 600, 200)
    b.op("aten::copy_", 650, 50)
    events = parse_trace_bytes(json.dumps(b.document()).encode()).events
    tree = build_host_tree(events)
    row = {events.strings[n]: i for i, n in enumerate(events.name.tolist())}
    parent = operator_parent(events, tree)
    assert parent[row["aten::mm"]] == row["## Call CompiledFxGraph abc ##"]
    assert parent[row["## Call CompiledFxGraph abc ##"]] == row["CompiledFunction"]
    assert parent[row["aten::copy_"]] == row["aten::addmm"]  # no frame between: the tree's own parent
    assert parent[row["CompiledFunction"]] == row["ProfilerStep#1"]  # past the frame between them
    counted = np.isin(events.kind, [int(Kind.CPU_OP), int(Kind.USER_ANNOTATION)])
    self_us = self_time_us(events.dur_us, parent, counted)
    assert self_us[row["CompiledFunction"]] == 900 - 870
    assert self_us[row["## Call CompiledFxGraph abc ##"]] == 870 - 500 - 200
    assert self_us[row["aten::addmm"]] == 150
    # the whole pipeline: the operator table does not count the compiled graph's matmuls twice, and the
    # Python frames are children too, as in PyTorch's key_averages: CompiledFunction keeps 900 - 890 us
    report = torchscope.analyze(b.write(tmp_path / "t.json"), use_cache=False)
    host_self = {r.name: r.host_self_us for r in report.operators}
    assert host_self["CompiledFunction"] == 10 and host_self["aten::mm"] == 500
