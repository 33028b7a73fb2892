"""A real trace of Lightning's own PyTorchProfiler (tests/data/captures/lightning_cpu/README.md): its
`[pl][profile]` action ranges name the phases, torch.optim's frames stand in for an `Optimizer.step#` range
opened before the recorded window, and ranges still open when the profiler stopped are counted only inside
the steps."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.markers import is_optimizer_frame, is_optimizer_step_frame, torch_optimizer_of_frame, user_phase_of

TRACE = Path(__file__).resolve().parents[1] / "data" / "captures" / "lightning_cpu"


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("[pl][profile][Strategy]SingleDeviceStrategy.training_step", "forward"),
        ("[pl][profile][Strategy]DDPStrategy.backward", "backward"),
        ("[pl][profile][LightningModule]Net.optimizer_step", "optimizer"),
        ("[pl][profile][LightningModule]Net.optimizer_zero_grad", "optimizer"),
        ("[pl][profile][_TrainingEpochLoop].train_dataloader_next", "data_loading"),
        ("[pl][profile][LightningModule]Net.on_before_backward", None),
        ("[pl][profile]run_training_batch", None),
        ("[pl][profile][Strategy]SingleDeviceStrategy.validation_step", "forward"),  # recorded steps too
        ("[pl][profile][LightningModule]Net.on_validation_batch_end", None),
    ],
)
def test_lightning_action_ranges_name_their_phase(name: str, phase: str | None) -> None:
    assert user_phase_of(name) == phase


def test_a_lightning_trace_reads_its_phases() -> None:
    report = torchscope.analyze(TRACE, jobs=1, use_cache=False)
    steps_us = sum(step.duration_us for step in report.steps)
    phases = {name: entry.us for name, entry in report.phases.items()}
    training_step = next(r for r in report.ranges if r.name.endswith("SingleDeviceStrategy.training_step"))
    # The training_step ranges are the forward (before: 0.08 ms of their 3.4 ms a step).
    assert phases["forward"] >= 0.9 * training_step.total_us / len(report.steps)
    # One step's optimizer update has no Optimizer.step# range in the trace, only torch.optim's frames
    # (before: 'other' 4.8 ms a step, 9.6 %, and outside_steps.work named it; now 2.5 ms).
    assert phases["other"] < 0.06 * report.mean_step_us
    assert "outside_steps.work" not in {f.id for f in report.findings}
    # The last Optimizer.step# range ends long after the last step: only its part inside the steps counts
    # (before: 39.9 ms a step against the optimizer phase's 35.0 ms).
    optimizer = report.measurements.optimizer
    assert optimizer.step_us_per_step <= steps_us / len(report.steps)
    assert optimizer.step_us_per_step == pytest.approx(phases["optimizer"], rel=0.05)
    assert (optimizer.optimizers, optimizer.implementation) == (["Adam"], "for_loop")


def test_zero_grad_frames_are_the_optimizers() -> None:
    assert is_optimizer_frame("torch/optim/optimizer.py(1024): zero_grad")
    assert is_optimizer_frame("torch/nn/modules/module.py(2948): zero_grad")  # model.zero_grad(): the same work
    assert not is_optimizer_frame("torch/nn/modules/module.py(1501): _call_impl")
    assert not is_optimizer_step_frame("torch/nn/modules/module.py(2948): zero_grad")


def test_torch_optims_step_frames_name_their_class() -> None:
    assert torch_optimizer_of_frame("torch/optim/lbfgs.py(313): step") == "LBFGS"
    assert torch_optimizer_of_frame("/usr/lib/python3/site-packages/torch/optim/adamw.py(210): step") == "AdamW"
    assert torch_optimizer_of_frame("torch/optim/adam.py(347): _single_tensor_adam") is None
    assert torch_optimizer_of_frame("mylib/optim/adam.py(3): step") is None


def test_an_optimizer_step_seen_only_through_its_frames_is_the_optimizers(tmp_path: Path) -> None:
    """Steps that start inside an optimizer step (the profiler stepped in its closure) whose
    `Optimizer.step#` range is not in the trace: torch.optim's wrapper frame marks the optimizer's time, and
    the class comes from the `step` frame it calls."""
    b = TraceBuilder()
    b.op("torch/optim/optimizer.py(530): wrapper", -100, 4_100, cat="python_function")
    b.op("torch/optim/lbfgs.py(313): step", -90, 4_080, cat="python_function")
    for i in range(3):
        b.step(i, i * 2_000, 2_000)
    b.op("aten::add_", 500, 3_000)  # the update, inside the frames only
    b.op("aten::mm", 4_500, 1_000)
    b.op("autograd::engine::evaluate_function: MmBackward0", 5_600, 300)  # a training step, not evaluation
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert report.measurements.optimizer.optimizers == ["LBFGS"]
    assert report.phases["optimizer"].us == pytest.approx(4_000 / 3, rel=1e-3)  # the frames inside the steps
    assert report.measurements.optimizer.step_us_per_step == pytest.approx(4_000 / 3, rel=1e-3)


def test_lightnings_own_work_between_the_phases_is_attributed_to_it() -> None:
    """The committed capture: Lightning's hook dispatch and bookkeeping outside the phases are its own
    (frames under `lightning/`), which outside_steps.work advises on through Lightning's knobs."""
    report = torchscope.analyze(TRACE, jobs=1, use_cache=False)
    section = report.measurements.outside_steps
    assert list(section.framework_us_per_step) == ["lightning"]
    assert "lightning: _call_lightning_module_hook (call.py:155)" in section.framework_culprits
    # Most of the named time outside the phases is Lightning's (its hooks call the user's code too, which
    # the phases cover).
    assert section.framework_us_per_step["lightning"] >= 0.5 * sum(section.culprits_us_per_step.values())


def test_the_users_callback_under_lightnings_dispatch_is_the_users(tmp_path: Path) -> None:
    """A user callback spinning 4 ms in on_train_batch_end runs from Lightning's `_call_callback_hooks`: its
    time is the user's culprit, not Lightning's fixed cost (frames as Lightning's PyTorchProfiler records)."""
    b = TraceBuilder()
    for i in range(4):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000)
        b.annotation("[pl][profile][Strategy]SingleDeviceStrategy.training_step", t0 + 10, 3_000)
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 3_100, 1_000)
        b.op("lightning/pytorch/trainer/call.py(203): _call_callback_hooks", t0 + 4_500, 4_400, cat="python_function")
        b.op("train.py(6): on_train_batch_end", t0 + 4_600, 4_000, cat="python_function")
        b.op("lightning/pytorch/trainer/call.py(312): _call_strategy_hook", t0 + 9_000, 300, cat="python_function")
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = report.measurements.outside_steps
    assert list(section.culprits_us_per_step)[0] == "on_train_batch_end (train.py:6)"
    assert section.culprits_us_per_step["on_train_batch_end (train.py:6)"] == pytest.approx(4_000)
    assert section.framework_us_per_step["lightning"] == pytest.approx(400 + 300)
    work = next(f for f in report.findings if f.id == "outside_steps.work")
    assert "Lightning's own" not in work.recommendation and work.recommendation.startswith("Move this work out")
