"""Which host work explains the step time outside every phase (analysis/host.py `outside_phases`), on a
synthetic trace: the training thread's frames and ops, other threads' ops, never other threads' Python
frames (a thread's root frame spans its whole life) nor what the profiler's or torchscope's own frames call."""

from __future__ import annotations

import json

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.frames import is_measurement_frame
from torchscope.analysis.sections import outside_steps
from torchscope.analysis.span import SpanInput
from torchscope.rundir.labels import FORWARD
from torchscope.trace.parse import parse_trace_bytes

WORKER_TID = 7  # a background Python thread (a compile pool's worker, a progress bar's monitor)
AUTOGRAD_TID = 9  # a thread that runs operators (the autograd engine's device thread)


def _span() -> SpanInput:
    b = TraceBuilder()
    # `torchscope run` runs the script inside its own frames: they hold the user's work, not overhead.
    b.op("/venv/lib/python3.12/site-packages/torchscope/capture/runner.py(203): _run_script_file", 900.0, 20_200, cat="python_function")
    b.op("train.py(40): main", 950.0, 20_100, cat="python_function")
    for step in range(2):
        t0 = 1000.0 + 10_000.0 * step
        b.step(step + 1, t0, 10_000)
        b.annotation(FORWARD, t0 + 100, 4000)
        b.op("aten::mm", t0 + 200, 3000)  # inside the forward phase: not outside work
        # Outside every phase, 5000 us from t0 + 4500: the user's logging, torchscope's own step hook and
        # what it calls, a background thread waiting, an operator on another thread.
        b.op("train.py(80): log_metrics", t0 + 4600, 1000, cat="python_function")
        b.op("aten::item", t0 + 4700, 500)
        b.op("/venv/lib/python3.12/site-packages/torchscope/capture/signals.py(50): __exit__", t0 + 6000, 400, cat="python_function")
        b.op("signal.py(54): signal", t0 + 6050, 300, cat="python_function")
        b.op("aten::add_", t0 + 7000, 800, tid=AUTOGRAD_TID)
    b.op("threading.py(1002): _bootstrap", 500.0, 20_000, cat="python_function", tid=WORKER_TID)
    b.op("concurrent/futures/thread.py(81): _worker", 510.0, 19_900, cat="python_function", tid=WORKER_TID)
    return SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))


def test_culprits_are_the_training_threads_frames_and_any_threads_operators() -> None:
    culprits = outside_steps(_span()).culprits_us_per_step
    assert culprits == pytest.approx({"log_metrics (train.py:80)": 1000.0, "aten::add_": 800.0})


def test_each_culprits_share_of_the_steps() -> None:
    """Logging in every step, an evaluation in one step of four (periodic work)."""
    b = TraceBuilder()
    for step in range(4):
        t0 = 1000.0 + 10_000.0 * step
        b.step(step + 1, t0, 10_000)
        b.annotation(FORWARD, t0 + 100, 2000)
        b.op("train.py(80): log_metrics", t0 + 3000, 500, cat="python_function")
        if step == 2:
            b.op("train.py(60): evaluate", t0 + 4000, 5000, cat="python_function")
            b.op("nn.Module: Sequential_0", t0 + 4100, 4000, cat="python_function")
    section = outside_steps(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))
    assert section.culprits_us_per_step == pytest.approx({"evaluate (train.py:60)": 1250.0, "log_metrics (train.py:80)": 500.0})
    assert section.culprit_steps_share == {"evaluate (train.py:60)": 0.25, "log_metrics (train.py:80)": 1.0}


def test_model_calls_under_the_culprits_are_counted_at_any_depth() -> None:
    # `acc = sum(model(x).argmax(1).eq(y).float().mean().item() for x, y in val)`: the culprit is `sum`, the
    # model calls (under no gradients, unlabelled) run two levels below it, 3 x 1000 us per step.
    b = TraceBuilder()
    for step in range(2):
        t0 = 1000.0 + 10_000.0 * step
        b.step(step + 1, t0, 10_000)
        b.annotation(FORWARD, t0 + 100, 2000)
        b.op("<built-in function sum>", t0 + 3000, 4000, cat="python_function")
        for k in range(3):
            b.op("train.py(14): <genexpr>", t0 + 3100 + 1200 * k, 1100, cat="python_function")
            b.op("nn.Module: Sequential_0", t0 + 3150 + 1200 * k, 1000, cat="python_function")
    section = outside_steps(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))
    assert next(iter(section.culprits_us_per_step)) == "sum"
    assert section.model_calls_us_per_step == pytest.approx(3000.0)


@pytest.mark.parametrize("name", ["/site-packages/torchscope/capture/profiler.py(232): step", "torchscope/capture/profiler.py(232): step",
                                  "torch/profiler/profiler.py(800): step"])
def test_torchscopes_and_the_profilers_frames_are_never_culprits(name: str) -> None:
    """PyTorch's tracer writes a frame's path relative to its sys.path entry when it can (a checkout on
    sys.path): torchscope's own step frame is overhead either way."""
    assert is_measurement_frame(name)
    assert not is_measurement_frame("train.py(12): step")


def test_a_decorators_wrapper_frame_names_the_function_it_runs() -> None:
    # `@torch.no_grad() def ema_update(): ...` runs inside torch's `decorate_context`, and a ContextDecorator
    # inside contextlib's `inner`: the user's functions are the culprits, each once.
    b = TraceBuilder()
    for step in range(2):
        t0 = 1000.0 + 10_000.0 * step
        b.step(step + 1, t0, 10_000)
        b.annotation(FORWARD, t0 + 100, 2000)
        b.op("torch/utils/_contextlib.py(120): decorate_context", t0 + 3000, 3000, cat="python_function")
        # The grad-mode switching around the call is no culprit of its own.
        b.op("torch/utils/_contextlib.py(154): clone", t0 + 3001, 4, cat="python_function")
        b.op("torch/autograd/grad_mode.py(80): __enter__", t0 + 3005, 4, cat="python_function")
        b.op("train.py(12): ema_update", t0 + 3010, 2900, cat="python_function")
        b.op("torch/autograd/grad_mode.py(85): __exit__", t0 + 5950, 4, cat="python_function")
        b.op("aten::mul_", t0 + 3100, 1000)
        b.op("contextlib.py(81): inner", t0 + 6500, 1000, cat="python_function")
        b.op("train.py(30): timed_block", t0 + 6510, 900, cat="python_function")
        # torch's clip_grad_norm_ runs under its own no-grad wrapper.
        b.op("torch/nn/utils/clip_grad.py(39): _no_grad_wrapper", t0 + 7600, 500, cat="python_function")
        b.op("torch/nn/utils/clip_grad.py(180): clip_grad_norm_", t0 + 7610, 480, cat="python_function")
    culprits = outside_steps(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))).culprits_us_per_step
    assert culprits == pytest.approx({"ema_update (train.py:12)": 2900.0, "timed_block (train.py:30)": 900.0,
                                      "clip_grad_norm_ (clip_grad.py:180)": 480.0})


def test_the_culprits_that_ran_the_foreach_norm() -> None:
    # clip_grad_norm_ on its multi-tensor path runs aten::_foreach_norm inside; a norm the script logs runs one
    # too, under its own frame: each is named with the culprit that ran it, neither with the other.
    b = TraceBuilder()
    for step in range(2):
        t0 = 1000.0 + 10_000.0 * step
        b.step(step + 1, t0, 10_000)
        b.annotation(FORWARD, t0 + 100, 2000)
        b.op("torch/nn/utils/clip_grad.py(184): clip_grad_norm_", t0 + 3000, 1000, cat="python_function")
        b.op("aten::_foreach_norm", t0 + 3100, 500)
        b.op("train.py(40): log_lr", t0 + 5000, 500, cat="python_function")
        b.op("aten::item", t0 + 5100, 100)
    section = outside_steps(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))
    assert section.foreach_norm_culprits == ["clip_grad_norm_ (clip_grad.py:184)"]
    b.op("train.py(50): log_grad_norm", 30_000, 1000, cat="python_function")  # after the steps: no culprit
    b.op("aten::_foreach_norm", 30_100, 500)
    section = outside_steps(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))
    assert section.foreach_norm_culprits == ["clip_grad_norm_ (clip_grad.py:184)"]
