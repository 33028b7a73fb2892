"""The per-module view (analysis/modules.py) on synthetic traces: paths from nesting, self time less the
child modules, device time of the kernels launched inside, means per step."""

from __future__ import annotations

import json

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.modules import module_rows, reduce_modules
from torchscope.analysis.nesting import build_host_tree
from torchscope.analysis.registry import Part, SpanKey
from torchscope.analysis.modules import ModuleTable
from torchscope.analysis.steps import find_steps
from torchscope.trace.parse import parse_trace_bytes


def _module(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.op(f"nn.Module: {name}", ts, dur, cat="python_function")


def _model_step(b: TraceBuilder, number: int, t0: float, gpu: bool = False) -> None:
    """Net_0 [0,90) holds Sequential_0 [5,85) which holds Linear_0 [10,40), ReLU_0 [40,50), Linear_1 [50,80)."""
    b.step(number, t0, 100)
    _module(b, "Net_0", t0, 90)
    b.op("<built-in method linear>", t0 + 2, 2, cat="python_function")  # a frame between modules
    _module(b, "Sequential_0", t0 + 5, 80)
    for name, start, dur in (("Linear_0", 10, 30), ("ReLU_0", 40, 10), ("Linear_1", 50, 30)):
        _module(b, name, t0 + start, dur)
        b.op("aten::addmm" if "Linear" in name else "aten::relu", t0 + start + 1, dur - 2)
        if gpu:
            b.launch(t0 + start + 2, 3, device_ts=t0 + start + 20, device_dur=dur / 2)


def _rows(b: TraceBuilder) -> dict[str, object]:
    events = parse_trace_bytes(json.dumps(b.document()).encode()).events
    rows = module_rows(events, build_host_tree(events), find_steps(events))
    parts = [Part(key=SpanKey(rank=0, worker="w", file="f", span=0, steps=3, step_us=300.0, has_device=False),
                  value=ModuleTable(rows=rows))]
    return {row.path: row for row in reduce_modules(parts)["modules"]}


def test_paths_self_time_and_per_step_means() -> None:
    b = TraceBuilder()
    for i in range(3):
        _model_step(b, i + 1, i * 100.0)
    _module(b, "Net_0", 400.0, 50)  # outside every step: not counted
    rows = _rows(b)
    assert list(rows) == [
        "Net_0", "Net_0/Sequential_0", "Net_0/Sequential_0/Linear_0", "Net_0/Sequential_0/Linear_1",
        "Net_0/Sequential_0/ReLU_0",
    ]
    net, seq, lin = rows["Net_0"], rows["Net_0/Sequential_0"], rows["Net_0/Sequential_0/Linear_0"]
    assert (net.calls, net.calls_per_step, net.depth, net.module) == (3, 1.0, 0, "Net")
    assert net.host_us_per_step == pytest.approx(90) and net.host_self_us_per_step == pytest.approx(10)
    assert seq.host_self_us_per_step == pytest.approx(10) and seq.depth == 1
    assert lin.host_us_per_step == pytest.approx(30) and lin.host_self_us_per_step == pytest.approx(30)
    assert lin.module == "Linear" and lin.depth == 2


def test_torchscope_runs_step_hook_inside_the_top_module_is_no_module_time() -> None:
    """Under `torchscope run` a step starts in the top-level module's forward pre-hook: the call's frame
    opens before its step, holds torchscope's and the profiler's frames, and the recording stops inside the
    first call after the last step. Each call counts in the step it ends in, without the measurement."""
    b = TraceBuilder()
    frame = "python_function"
    b.op("train.py(7): <module>", -5, 400, cat=frame)
    for i in range(3):
        t0 = i * 100.0
        _module(b, "Net_0", t0, 60)
        b.op("torchscope/capture/phases.py(241): _forward_pre", t0 + 1, 8, cat=frame)
        b.op("torch/profiler/profiler.py(1227): step", t0 + 2, 6, cat=frame)  # inside the hook: counted once
        b.op("<built-in function next>", t0 + 3, 1, cat=frame)
        b.op("torchscope/capture/quiet.py(38): native_stderr", t0 + 3.2, 0.5, cat=frame)  # still inside the hook
        b.step(i + 1, t0 + 4, 100 if i == 2 else 96)  # starts inside the hook; the last ends in the next call
        b.op("torch/autograd/profiler.py(918): __enter__", t0 + 10, 2, cat=frame)  # the phase label's range
        _module(b, "Linear_0", t0 + 20, 30)
        b.op("torchscope/capture/phases.py(241): _forward_pre", t0 + 21, 4, cat=frame)  # every module's hook
        b.op("aten::addmm", t0 + 30, 10)
    _module(b, "Net_0", 300.0, 6)  # the call whose hook stopped the recording
    rows = _rows(b)
    net, lin = rows["Net_0"], rows["Net_0/Linear_0"]
    assert net.calls == lin.calls == 3
    assert net.host_us_per_step == pytest.approx(60 - 8 - 2 - 4)
    assert net.host_self_us_per_step == pytest.approx(60 - 8 - 2 - 30)
    assert lin.host_us_per_step == lin.host_self_us_per_step == pytest.approx(30 - 4)


def test_device_time_is_inclusive_of_child_modules() -> None:
    b = TraceBuilder().gpu()
    for i in range(3):
        _model_step(b, i + 1, i * 100.0, gpu=True)
    rows = _rows(b)
    assert rows["Net_0/Sequential_0/Linear_0"].device_us_per_step == pytest.approx(15)
    assert rows["Net_0/Sequential_0/ReLU_0"].device_us_per_step == pytest.approx(5)
    assert rows["Net_0"].device_us_per_step == pytest.approx(35)


def test_a_trace_without_module_events_has_no_rows() -> None:
    b = TraceBuilder()
    b.step(1, 0, 10)
    b.op("aten::add", 1, 2)
    assert _rows(b) == {}


def test_measurement_frames_holding_module_calls_and_a_users_torchscope_folder() -> None:
    """A torchscope frame around module calls (a closure's wrapper inside the model's call) is not taken
    off twice; a user's project in a folder named torchscope is the user's code, not measurement."""
    b = TraceBuilder()
    frame = "python_function"
    for i in range(3):
        t0 = i * 100.0
        b.step(i + 1, t0, 100)
        _module(b, "Net_0", t0 + 1, 90)
        b.op("/home/me/torchscope/model.py(5): forward", t0 + 2, 85, cat=frame)  # the user's, in a torchscope folder
        b.op("torchscope/capture/phases.py(300): _closure_wrapper", t0 + 5, 60, cat=frame)
        _module(b, "Linear_0", t0 + 10, 40)
        b.op("torchscope/capture/phases.py(241): _forward_pre", t0 + 11, 4, cat=frame)
        b.op("aten::addmm", t0 + 20, 10)
    rows = _rows(b)
    net, lin = rows["Net_0"], rows["Net_0/Linear_0"]
    assert lin.host_us_per_step == pytest.approx(40 - 4)
    assert net.host_us_per_step == pytest.approx(90 - 4) and net.host_self_us_per_step == pytest.approx(90 - 40)
