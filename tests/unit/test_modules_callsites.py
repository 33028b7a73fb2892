"""Call sites of the top operators (analysis/callsites.py) on synthetic traces: the innermost user frame
above each op, library and profiler frames skipped, the sites of an op adding up to its self time."""

from __future__ import annotations

import json

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.callsites import CallSiteTable, call_site_rows, is_user_frame, reduce_call_sites
from torchscope.analysis.registry import Part, SpanKey
from torchscope.analysis.span import SpanInput
from torchscope.trace.parse import parse_trace_bytes


def _frame(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.op(name, ts, dur, cat="python_function")


def test_user_frames() -> None:
    assert is_user_frame("train.py(42): train_step")
    assert is_user_frame("/home/me/project/model.py(7): forward")
    assert not is_user_frame("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py(125): forward")
    assert not is_user_frame("/work/main/torchscope/capture/phases.py(300): backward")
    assert not is_user_frame("<built-in method linear of PyCapsule object at 0x7f>")
    assert not is_user_frame("nn.Module: Linear_0")


def test_innermost_user_frame_and_totals() -> None:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 100.0
        b.step(i + 1, t0, 100)
        _frame(b, "train.py(20): <module>", t0, 95)
        _frame(b, "model.py(7): forward", t0 + 5, 40)
        _frame(b, "/x/site-packages/torch/nn/modules/linear.py(125): forward", t0 + 6, 30)
        b.op("aten::addmm", t0 + 7, 20)  # called from model.py:7 through a library frame
        b.op("aten::addmm", t0 + 50, 10)  # called from train.py:20 directly
        b.op("aten::add", t0 + 70, 5)
    events = parse_trace_bytes(json.dumps(b.document()).encode())
    rows = call_site_rows(SpanInput(events))
    key = SpanKey(rank=0, worker="w", file="f", span=0, steps=3, step_us=300.0, has_device=False)
    merged = reduce_call_sites([Part(key=key, value=CallSiteTable(rows=rows))])["call_sites"]
    found = [(r.operator, r.site, r.calls, r.host_self_us) for r in merged]
    assert found == [
        ("aten::addmm", "forward (model.py:7)", 3, pytest.approx(60.0)),
        ("aten::addmm", "<module> (train.py:20)", 3, pytest.approx(30.0)),
        ("aten::add", "<module> (train.py:20)", 3, pytest.approx(15.0)),
    ]


def test_no_stacks_no_call_sites() -> None:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("aten::addmm", 7, 20)
    assert call_site_rows(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))) == []
