"""The user's call stack above each call-site row (analysis/callsites.py) on synthetic traces: two callers
of one function reaching the same op stay one row (keyed by operator and innermost site) showing the
costliest stack summed over spans, library frames between user frames left out, deep stacks cut to
STACK_DEPTH innermost frames, and reports without the field still load."""

from __future__ import annotations

import json

import msgspec
import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.callsites import STACK_DEPTH, CallSiteTable, call_site_rows, reduce_call_sites
from torchscope.analysis.registry import Part, SpanKey
from torchscope.analysis.span import SpanInput
from torchscope.report.model import CallSiteRow
from torchscope.trace.parse import parse_trace_bytes

LIBRARY = "/x/site-packages/torch/nn/modules/module.py(1500): _call_impl"


def _frame(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.op(name, ts, dur, cat="python_function")


def _span(train_calls: int, eval_calls: int) -> list[CallSiteRow]:
    """`train` and `evaluate` (train.py) both call `helper` (model.py), which runs aten::mm (20 us from
    train, 10 us from evaluate), through a library frame on the train path."""
    b = TraceBuilder()
    _frame(b, "train.py(1): <module>", 0, 10_000)
    t = 10.0
    for _ in range(train_calls):
        _frame(b, "train.py(10): train", t, 40)
        _frame(b, LIBRARY, t + 1, 38)
        _frame(b, "model.py(5): helper", t + 2, 30)
        b.op("aten::mm", t + 3, 20)
        t += 50
    for _ in range(eval_calls):
        _frame(b, "train.py(30): evaluate", t, 40)
        _frame(b, "model.py(5): helper", t + 2, 30)
        b.op("aten::mm", t + 3, 10)
        t += 50
    return call_site_rows(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))


def _reduce(*spans: list[CallSiteRow]) -> list[CallSiteRow]:
    parts = [Part(key=SpanKey(rank=0, worker="w", file=f"f{i}", span=i, steps=1, step_us=1.0, has_device=False),
                  value=CallSiteTable(rows=rows)) for i, rows in enumerate(spans)]
    return reduce_call_sites(parts)["call_sites"]


TRAIN = ["<module> (train.py:1)", "train (train.py:10)", "helper (model.py:5)"]
EVAL = ["<module> (train.py:1)", "evaluate (train.py:30)", "helper (model.py:5)"]


def test_a_span_keeps_one_row_per_stack() -> None:
    rows = _span(train_calls=3, eval_calls=1)
    assert sorted((r.stack, r.calls, r.host_self_us) for r in rows) == [(EVAL, 1, 10.0), (TRAIN, 3, 60.0)]
    assert {r.site for r in rows} == {"helper (model.py:5)"}


def test_two_callers_of_one_function_are_one_row_with_the_costliest_stack() -> None:
    [row] = _reduce(_span(train_calls=3, eval_calls=1))
    assert (row.operator, row.site, row.calls, row.host_self_us) == ("aten::mm", "helper (model.py:5)", 4, 70.0)
    assert row.stack == TRAIN  # the library frame between train and helper is not the user's
    assert row.stack_share == pytest.approx(60 / 70, abs=1e-4)


def test_the_same_stack_is_summed_over_spans_before_the_costliest_is_chosen() -> None:
    # Span 1: train 60 us, evaluate 10 us; span 2: evaluate only, 60 us. Over both, evaluate (70) costs
    # more than train (60), though each span alone has a different costliest stack.
    [row] = _reduce(_span(train_calls=3, eval_calls=1), _span(train_calls=0, eval_calls=6))
    assert (row.calls, row.host_self_us) == (10, 130.0)
    assert row.stack == EVAL and row.stack_share == pytest.approx(70 / 130, abs=1e-4)


def test_a_deep_stack_keeps_its_innermost_frames() -> None:
    b = TraceBuilder()
    depth = STACK_DEPTH + 3
    for level in range(depth):
        _frame(b, f"deep.py({level + 1}): f{level}", level, 1000 - 2 * level)
    b.op("aten::add", depth + 1, 5)
    [row] = _reduce(call_site_rows(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))))
    assert row.stack == [f"f{level} (deep.py:{level + 1})" for level in range(depth - STACK_DEPTH, depth)]
    assert row.site == row.stack[-1] and row.stack_share == 1.0


def test_a_row_without_the_stack_fields_still_loads() -> None:
    old = b'{"operator": "aten::mm", "site": "helper (model.py:5)", "calls": 2, "host_self_us": 3.0}'
    row = msgspec.json.decode(old, type=CallSiteRow)
    assert row.stack == [] and row.stack_share == 0.0
    [merged] = _reduce([row, row])  # rows from an extract cached before stacks: merged by site as before
    assert (merged.calls, merged.stack, merged.stack_share) == (4, [], 0.0)


def _terminal(rows: list[CallSiteRow], width: int) -> str:
    from rich.console import Console

    from torchscope.render.callsites_terminal import call_sites_table
    from torchscope.report.model import Report, RunInfo

    report = Report(torchscope_version="0", run=RunInfo(paths=[], trace_files=[], ranks=[], device_kind="cpu"),
                    steps=[], breakdown={}, call_sites=rows)
    console = Console(width=width, record=True, color_system=None)
    console.print(call_sites_table(report, 10, width))
    return console.export_text()


def test_the_terminal_names_the_callers_only_where_they_fit() -> None:
    rows = _reduce(_span(train_calls=3, eval_calls=1))
    wide = _terminal(rows, 140)
    assert "called by" in wide and "train (train.py:10) < <module> (train.py:1)" in wide
    assert all(len(line) <= 140 for line in wide.splitlines())
    narrow = _terminal(rows, 100)
    assert "called by" not in narrow and "helper (model.py:5)" in narrow
