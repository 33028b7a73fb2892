"""Plain `torch.profiler` captures (no torchscope labels), on synthetic traces: the host phases without
forward markers (each micro-batch's forward under gradient accumulation, every iteration of a trace without
step markers, the autograd engine's own ops on its device thread), none of them 'other'; and the step
`prof.step()` opens just before the profiler stops, which holds no operator and is no step."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope
from helpers.phase_shares import phase_shares
from helpers.trace_builder import HOST_TID, TraceBuilder

ENGINE_TID = HOST_TID + 1


def _micro_batch(b: TraceBuilder, t0: float, backward_tid: int = HOST_TID) -> None:
    """200 us: forward 0-100 on the loop's thread, backward 100-200 (two nodes with a gap between them)."""
    b.op("aten::linear", t0, 90)
    b.op("aten::mse_loss", t0 + 90, 10)
    b.op("autograd::engine::evaluate_function: MseLossBackward0", t0 + 100, 40, tid=backward_tid)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 150, 50, tid=backward_tid)


def test_each_micro_batch_forward_is_forward() -> None:
    # Gradient accumulation: 4 micro-batches a step, then the optimizer (torch's own range).
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000.0
        b.step(i + 1, t0, 1_000)
        for m in range(4):
            _micro_batch(b, t0 + m * 200)
        b.annotation("Optimizer.step#SGD.step", t0 + 800, 150)
        b.op("aten::add_", t0 + 810, 100)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(0.4)  # 4 x 100 us, not only the first micro-batch's
    assert shares["backward"] == pytest.approx(0.36)  # the nodes; the engine's gap between them is the loop thread's
    assert shares["optimizer"] == pytest.approx(0.15)
    assert shares["other"] == pytest.approx(0.09)  # the gaps inside each backward (4 x 10 us) and the step's tail (50 us)


def test_a_trace_without_steps_has_every_iteration_forward() -> None:
    b = TraceBuilder()
    for i in range(5):
        _micro_batch(b, i * 200.0)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(0.5)
    assert shares["other"] == pytest.approx(0.05)


def test_the_engine_threads_own_ops_are_backward() -> None:
    # A GPU backward runs on the engine's device thread; between its nodes it accumulates gradients
    # (aten::add at the top level of that thread), work of the backward no node holds.
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000.0
        b.step(i + 1, t0, 1_000)
        _micro_batch(b, t0, backward_tid=ENGINE_TID)
        b.op("aten::add", t0 + 141, 8, tid=ENGINE_TID)
        b.op("aten::randn", t0 + 300, 50)  # the loop's own work after the backward: other
    shares = phase_shares(b)
    assert shares["backward"] == pytest.approx(0.098)
    assert shares["forward"] == pytest.approx(0.1)
    # Other: the loop's 50 us, the 2 us left of the gap, and the step's idle 600 us.
    assert shares["other"] == pytest.approx(0.802)


def _trace_with_a_trailing_empty_step(tmp_path: Path, steps: int) -> Path:
    """`steps` steps of one micro-batch, then the step `prof.step()` opened just before the profiler stopped:
    it holds only the profiler's own Python calls."""
    b = TraceBuilder()
    for i in range(steps):
        b.step(i + 2, i * 1_000.0, 1_000)
        _micro_batch(b, i * 1_000.0)
    t0 = steps * 1_000.0
    b.step(steps + 2, t0, 77)
    b.op("torch/profiler/profiler.py(1135): stop", t0 + 40, 30, cat="python_function")
    return b.write(tmp_path / "t.pt.trace.json")


def test_a_trailing_step_without_operators_is_no_step(tmp_path: Path) -> None:
    rep = torchscope.analyze(_trace_with_a_trailing_empty_step(tmp_path, 3), jobs=1, use_cache=False)
    assert [s.step for s in rep.steps] == [2, 3, 4]


def test_a_trace_whose_only_step_is_empty_says_so(tmp_path: Path) -> None:
    rep = torchscope.analyze(_trace_with_a_trailing_empty_step(tmp_path, 0), jobs=1, use_cache=False)
    assert rep.steps == []
    found = {f.id: f for f in rep.findings}
    assert found["trace_quality.few_steps"].title.startswith("No complete step captured")


def test_the_dataloaders_last_fetch_is_no_step(tmp_path: Path) -> None:
    # `for batch in loader`: the step the last prof.step() opens holds the fetch that raises StopIteration.
    b = TraceBuilder()
    for i in range(3):
        b.step(i + 2, i * 1_000.0, 1_000)
        _micro_batch(b, i * 1_000.0)
    b.step(5, 3_000.0, 40)
    b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 3_005.0, 30)
    b.op("aten::empty", 3_010.0, 5)  # inside the fetch
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert [s.step for s in rep.steps] == [2, 3, 4]


def test_with_stacks_only_the_model_calls_between_backward_passes_are_forward() -> None:
    # Two micro-batches; after the first backward the loop logs a metric (no model call): not forward.
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000.0
        b.step(i + 1, t0, 1_000)
        _micro_batch(b, t0)
        b.op("aten::linalg_vector_norm", t0 + 210, 90)  # the metric, 210-300
        b.op("nn.Module: Sequential_0", t0 + 300, 80, cat="python_function")
        _micro_batch(b, t0 + 300)  # its forward 300-400 (the model 300-380, the loss after it)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(0.2)  # 0-100 and 300-400
    assert shares["other"] == pytest.approx(0.62)  # the metric 90, the gaps beside the backward nodes 30, the tail 500


def test_without_step_markers_the_loop_thread_is_not_the_engines(tmp_path: Path) -> None:
    # A GPU backward's engine thread can record more events than the loop: the loop's forward stays forward.
    b = TraceBuilder()
    for i in range(5):
        t0 = i * 1_000.0
        b.op("aten::linear", t0, 100)
        for n in range(3):
            b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 200 + 100 * n, 80, tid=ENGINE_TID)
            b.op("aten::mm", t0 + 210 + 100 * n, 60, tid=ENGINE_TID)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(500 / 4_480)  # one window: 0 to the last node's end
    assert shares["backward"] == pytest.approx(1_200 / 4_480)


def test_a_span_without_steps_and_with_forward_labels(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.annotation("## forward ##", 0.0, 100)  # labelled work before the only step, which the stop cut off
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 150, 50)
    b.step(2, 300.0, 77)
    b.op("torch/profiler/profiler.py(1135): stop", 320, 30, cat="python_function")
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.steps == [] and "trace_quality.few_steps" in {f.id for f in rep.findings}


def test_a_span_without_steps_and_with_operators_outside_them(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.op("aten::mm", -1.0, 500)  # starts before the only step, which then holds no operator of its own
    b.step(1, 0.0, 100)
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.steps == []


def test_a_span_without_steps_and_with_collectives(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.op("gloo:all_reduce", 0.0, 50)  # before the only step, which the profiler's stop cut off
    b.step(1, 100.0, 77)
    b.op("torch/profiler/profiler.py(1135): stop", 120, 30, cat="python_function")
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.steps == []


def test_with_stacks_the_python_inside_the_first_forward_is_forward() -> None:
    """A Hugging Face Trainer's step: `compute_loss` calls the model, whose ops leave Python between them
    (60 of its 100 us here); that Python is the forward's, not work outside the phases."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000.0
        b.step(i + 1, t0, 1_000)
        b.op("transformers/trainer.py(2130): compute_loss", t0 + 50, 150, cat="python_function")
        b.op("nn.Module: BertForSequenceClassification_0", t0 + 60, 130, cat="python_function")
        b.op("aten::linear", t0 + 80, 20)
        b.op("aten::gelu", t0 + 150, 20)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 300, 100)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(0.24)  # from the model call's start (60) to the backward (300)
    assert shares["backward"] == pytest.approx(0.1)


def test_with_stacks_an_earlier_model_call_keeps_only_its_ops_as_forward() -> None:
    """A rollout or teacher call, then a reward in Python, then the training forward: only the call that
    leads into the backward is the training forward with its Python; the earlier call's Python and the
    reward stay outside the phases, where they are named."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 1_000.0
        b.step(i + 1, t0, 1_000)
        b.op("nn.Module: Policy_0", t0 + 10, 100, cat="python_function")  # the rollout, under no_grad
        b.op("aten::linear", t0 + 20, 30)
        b.op("reward.py(12): python_reward", t0 + 150, 300, cat="python_function")
        b.op("nn.Module: Policy_0", t0 + 500, 100, cat="python_function")  # the training forward
        b.op("aten::linear", t0 + 520, 30)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 700, 100)
    shares = phase_shares(b)
    assert shares["forward"] == pytest.approx(0.03 + 0.2)  # the rollout's op; the training call to the backward
    assert shares["other"] == pytest.approx(1 - 0.23 - 0.1)
