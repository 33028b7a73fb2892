"""Traces over their size budget lose their shortest Python calls, and say so (capture/thinning.py, issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.capture.thinning import thin_trace
from torchscope.rundir.thinning import HEADER_KEY, dropped_starts


def _python_heavy(path: Path, steps: int = 3, calls: int = 400) -> Path:
    """Steps of a data fetch made of many short Python calls under a few long ones, then a forward op."""
    b = TraceBuilder()
    t = 0.0
    for step in range(steps):
        b.step(step, t, 1000.0)
        b.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 600.0, cat="user_annotation")
        b.op("dataset.py(10): __getitem__", t + 1, 590.0, cat="python_function")
        for i in range(calls):  # the per-element helper: short, many
            b.op("dataset.py(5): feature", t + 2 + i * 1.4, 0.3 + (i % 7) * 0.1, cat="python_function")
        b.op("torchscope:forward", t + 610, 380.0, cat="user_annotation")
        b.op("aten::linear", t + 620, 300.0)
        t += 1000.0
    return b.write(path)


def test_a_trace_within_budget_is_left_alone(tmp_path: Path) -> None:
    path = _python_heavy(tmp_path / "t.json")
    before = path.read_bytes()
    assert thin_trace(path, len(before) + 1) is None
    assert thin_trace(path, 0) is None  # 0: no bound
    assert path.read_bytes() == before


def test_shortest_python_calls_go_first_and_the_header_says_so(tmp_path: Path) -> None:
    path = _python_heavy(tmp_path / "t.json")
    original = json.loads(path.read_text())["traceEvents"]
    budget = path.stat().st_size // 3
    summary = thin_trace(path, budget)
    assert summary is not None
    assert path.stat().st_size <= budget
    trace = json.loads(path.read_text())
    kept = trace["traceEvents"]
    # Everything but Python calls is kept, and the long Python frames too.
    assert [e for e in kept if e["cat"] != "python_function"] == [e for e in original if e["cat"] != "python_function"]
    assert sum(e["name"].endswith("__getitem__") for e in kept) == 3
    python = [e for e in original if e["cat"] == "python_function"]
    dropped = [e for e in python if e not in kept]
    assert summary["python_events"] == len(python) and summary["python_events_dropped"] == len(dropped) > 0
    assert max(e["dur"] for e in dropped) <= summary["kept_longer_than_us"] < min(
        e["dur"] for e in kept if e["cat"] == "python_function"
    )
    assert summary["dropped_us"] == pytest.approx(sum(e["dur"] for e in dropped))
    # Where they started survives, to the bin: the overhead correction still counts them per phase.
    starts = dropped_starts(trace)
    assert starts.size == len(dropped) and trace[HEADER_KEY]["budget_mb"] == pytest.approx(budget / 2**20)
    assert np.abs(np.sort(starts) - np.sort([e["ts"] for e in dropped])).max() <= 50.0 + 1e-6


def test_phases_and_overhead_counts_are_unchanged_by_thinning(tmp_path: Path) -> None:
    from torchscope.pipeline.analyze import analyze

    whole = _python_heavy(tmp_path / "whole" / "w.pt.trace.json")
    thin = _python_heavy(tmp_path / "thin" / "w.pt.trace.json")
    assert thin_trace(thin, thin.stat().st_size // 3) is not None
    a, b = (analyze([str(p.parent)], jobs=1, use_cache=False) for p in (whole, thin))
    assert {n: p.percent for n, p in a.phases.items()} == {n: p.percent for n, p in b.phases.items()}
    pa, pb = a.measurements.profiler_overhead, b.measurements.profiler_overhead
    assert pb.python_events_per_step == pytest.approx(pa.python_events_per_step)
    assert pb.python_events_dropped > 0 and pb.thinned_traces == [thin.name] and not pa.thinned_traces
    assert "trace_quality.trace_thinned" in {f.id for f in b.findings}
    assert "trace_quality.trace_thinned" not in {f.id for f in a.findings}


def test_a_trace_that_cannot_be_read_back_is_an_error_for_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{" + " " * 100)
    with pytest.raises(Exception):
        thin_trace(path, 10)


def test_collections_and_saved_stacks_are_kept_whatever_their_length(tmp_path: Path) -> None:
    path = _python_heavy(tmp_path / "t.json")
    trace = json.loads(path.read_text())
    short = [{"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": 100.0 + i, "dur": 0.1}
             for i, name in enumerate(["Python GC", "torch/fx/traceback.py(497): format_stack", "other.py(1): f"])]
    trace["traceEvents"] += short
    path.write_text(json.dumps(trace))
    summary = thin_trace(path, path.stat().st_size // 3)
    assert summary is not None and summary["kept_longer_than_us"] > 0.1
    names = {e["name"] for e in json.loads(path.read_text())["traceEvents"]}
    assert {"Python GC", "torch/fx/traceback.py(497): format_stack"} <= names and "other.py(1): f" not in names
