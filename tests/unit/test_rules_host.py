"""Host-side rules on hand-built Reports: host_overhead.*, optimizer.*, outside_steps.work and
synchronization.host_device."""

from __future__ import annotations

import msgspec
import pytest
from test_rules_support import finding, findings, fixes, gpu, report
from torchscope.analysis.frames import training_framework
from torchscope.report.measurements import (
    ANOMALY_CHECK,
    AnomalyMode,
    Compile,
    DataLoader,
    DeviceIdle,
    Dispatch,
    GarbageCollection,
    LaunchOverhead,
    Measurements,
    ModuleHooks,
    Optimizer,
    OutsideSteps,
    Patterns,
    ProfilerOverhead,
    Savings,
    Synchronization,
)

COMPILE_FIX = {"torch.compile": ("code_change", "model = torch.compile(model)")}


def _dispatch(tiny_ops: float, tiny_us: float, gap_us: float) -> Measurements:
    return Measurements(
        dispatch=Dispatch(
            tiny_ops_per_step=tiny_ops, tiny_op_us_per_step=tiny_us, python_gap_us_per_step=gap_us, ops_per_step=800, median_op_us=4.0
        )
    )


def test_dispatch_bound_cpu_run() -> None:
    """No per-element loop to batch: torch.compile's saving, from the Python between ops (1000 us of a
    10 ms step: 0.10) to that plus the tiny ops (2500 us: 0.25), costed at the middle (0.175)."""
    f = finding(report(measurements=_dispatch(500, 1500, 1000)), "host_overhead.dispatch")
    assert (f.category, f.severity) == ("host_overhead", "warning")
    assert f.time_share == pytest.approx(0.175)
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.10, 0.25))
    assert f.evidence == {
        "tiny_ops_per_step": 500,
        "tiny_op_us_per_step": 1500,
        "python_gap_us_per_step": 1000,
        "ops_in_forward_backward_per_step": 800,
        "median_op_us": 4.0,
        "compiled_regions_per_step": 0.0,
    }
    assert fixes(f) == COMPILE_FIX
    assert "host_overhead.python" not in findings(report(measurements=_dispatch(500, 1500, 1000)))


def test_an_already_compiled_model_is_not_told_to_compile() -> None:
    for measurements, finding_id in ((_dispatch(500, 1500, 1000), "host_overhead.dispatch"), (_dispatch(50, 100, 3000), "host_overhead.python")):
        measurements.compile = Compile(compiled_regions_per_step=2.0)
        f = finding(report(measurements=measurements), finding_id)
        assert fixes(f) == {}, finding_id
        assert "torch.compile(model)" not in f.recommendation and "let torch.compile trace it" not in f.recommendation
        assert "already runs compiled (2 compiled region(s) per step)" in f.recommendation
        assert "graph_breaks" in f.recommendation and f.evidence["compiled_regions_per_step"] == 2.0


def test_dispatch_with_a_per_element_loop_is_costed_as_batching_it() -> None:
    """With torch's ForLoopIndexingPattern in the steps the fix is batching the loop; without a what-if
    replay in the Report its cost is the measured tiny ops plus Python (2500 us of 10 ms)."""
    measurements = _dispatch(500, 1500, 1000)
    measurements.patterns = Patterns(indexing_loop_iterations_per_step=64, indexing_loop_compute_us_per_step=500)
    f = finding(report(measurements=measurements), "host_overhead.dispatch")
    assert f.time_share == pytest.approx(0.25)


def test_dispatch_saving_leaves_out_the_profilers_own_cost() -> None:
    """A per-element loop to batch, recorded 2x slower (10 ms recorded, 5 ms unprofiled), 4 ms of it the
    profiler's cost in forward and backward: the low end takes that cost off the recorded 2.5 ms (ops and
    Python: nothing left), the high end scales the recorded 2.5 ms as forward and backward are (their 80 %
    recorded is 60 % unprofiled). Without a loop both ends are scaled (the profiler's cost is spread over
    all the phases' events, not only the tiny ops and gaps)."""
    overhead = ProfilerOverhead(
        method="step_clock", unprofiled_step_us=5_000.0, profiled_step_us=10_000.0,
        overhead_us_by_phase={"forward": 1_500.0, "backward": 2_500.0},
        corrected_percent={"forward": 20.0, "backward": 40.0, "other": 40.0},
    )
    measurements = _dispatch(500, 1500, 1000)
    measurements.profiler_overhead = overhead
    phases = {"forward": 0.3, "backward": 0.5, "other": 0.2}
    f = finding(report(measurements=measurements, phases=phases), "host_overhead.dispatch")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.10 * 60 / 80, 0.25 * 60 / 80))
    measurements.patterns = Patterns(indexing_loop_iterations_per_step=64, indexing_loop_compute_us_per_step=500)
    f = finding(report(measurements=measurements, phases=phases), "host_overhead.dispatch")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.0, 0.25 * 60 / 80))
    # A loop of recurrent cells: the same finding says to run the sequence through nn.LSTM.
    measurements.patterns = Patterns(recurrent_cells_per_step=50, recurrent_cell="aten::lstm_cell")
    f = finding(report(measurements=measurements), "host_overhead.dispatch")
    assert "calls a recurrent cell (aten::lstm_cell) 50 times per step" in f.recommendation and "nn.LSTM" in f.recommendation


def test_indexing_loop_over_a_recurrent_cell_advises_the_sequence_module() -> None:
    patterns = Patterns(indexing_loop_iterations_per_step=50, indexing_loop_us_per_step=4_000,
                        recurrent_cells_per_step=50, recurrent_cell="aten::gru_cell")
    f = finding(report(measurements=Measurements(patterns=patterns)), "host_overhead.indexing_loop")
    assert f.title.startswith("A Python loop runs a recurrent cell (aten::gru_cell) one time step at a time")
    assert fixes(f) == {"nn.LSTM": ("code_change", "output, h = nn.GRU(input_size, hidden_size)(x)  # x: (time, batch, features)")}
    assert "nn.GRU" in f.recommendation and "index with a tensor" not in f.recommendation
    for cell, fix in (("aten::lstm_cell", "output, (h, c) = nn.LSTM(input_size, hidden_size)(x)"),
                      ("aten::rnn_relu_cell", "output, h = nn.RNN(input_size, hidden_size, nonlinearity='relu')(x)")):
        patterns = msgspec.structs.replace(patterns, recurrent_cell=cell)
        value = fixes(finding(report(measurements=Measurements(patterns=patterns)), "host_overhead.indexing_loop"))["nn.LSTM"][1]
        assert value.startswith(fix), value
    plain = finding(report(measurements=Measurements(patterns=Patterns(indexing_loop_iterations_per_step=50, indexing_loop_us_per_step=4_000))), "host_overhead.indexing_loop")
    assert list(fixes(plain)) == ["indexing loop"] and "index with a tensor" in plain.recommendation


def test_dispatch_is_reported_from_200_tiny_ops_whatever_their_share() -> None:
    f = finding(report(measurements=_dispatch(200, 100, 0)), "host_overhead.dispatch")
    assert f.severity == "info" and f.time_share == pytest.approx(0.005)  # (0 + 100 us) / 2 of 10 ms
    assert "host_overhead.dispatch" not in findings(report(measurements=_dispatch(199, 3000, 0)))
    assert "host_overhead.dispatch" not in findings(report(measurements=_dispatch(500, 3000, 0), device=gpu()))


def test_python_between_ops_with_cpu_contention() -> None:
    measurements = _dispatch(50, 100, 3500)
    measurements.dataloader = DataLoader(multi_process_fetches=4)
    f = finding(report(measurements=measurements, manifest={"environment": {"cpu_count": 4}}), "host_overhead.python")
    assert (f.category, f.severity, f.time_share) == ("host_overhead", "critical", 0.35)
    assert f.evidence["cpu_count"] == 4 and f.evidence["python_gap_us_per_step"] == 3500
    assert "4 CPU(s) are shared" in f.recommendation
    assert fixes(f) == COMPILE_FIX


def test_python_gaps_below_ten_percent_are_not_reported() -> None:
    assert finding(report(measurements=_dispatch(50, 100, 1000)), "host_overhead.python").severity == "warning"
    assert "host_overhead.python" not in findings(report(measurements=_dispatch(50, 100, 999)))


def _launch(short: float, idle_us: float, explained_us: float) -> Measurements:
    host_ops = {f"op{i}": 1000.0 - 100 * i for i in range(7)}
    return Measurements(
        launch=LaunchOverhead(short_kernel_fraction=short, kernels_per_step=400, median_kernel_us=2.0, median_launch_us=15.0),
        idle=DeviceIdle(idle_us_per_step=idle_us, explained_us_per_step=explained_us, host_ops_us_per_step=host_ops),
    )


def test_launch_bound_claims_only_the_unexplained_idle_time() -> None:
    rep = report(measurements=_launch(0.9, 7000, 1000), device=gpu(utilization=0.3))
    f = finding(rep, "host_overhead.launch_bound")
    assert (f.category, f.severity, f.time_share) == ("host_overhead", "critical", 0.6)
    assert f.evidence == {
        "short_kernel_fraction": 0.9,
        "kernels_per_step": 400,
        "median_kernel_us": 2.0,
        "median_launch_us": 15.0,
        "gpu_utilization": 0.3,
        "device_idle_share": 0.7,
        "unexplained_idle_share": 0.6,
        "host_ops_during_idle_us_per_step": {f"op{i}": 1000.0 - 100 * i for i in range(5)},
    }
    assert fixes(f) == {
        **COMPILE_FIX,
        "CUDA graphs": ("code_change", "model = torch.compile(model, mode='reduce-overhead')"),
    }
    assert "idle.device" not in findings(rep)  # the same gaps, reported once


def test_launch_bound_needs_short_kernels_low_utilization_and_unexplained_idle() -> None:
    def found(short: float, utilization: float, explained_us: float) -> bool:
        rep = report(measurements=_launch(short, 7000, explained_us), device=gpu(utilization=utilization))
        return "host_overhead.launch_bound" in findings(rep)

    assert found(0.5, 0.69, 0)
    assert not found(0.49, 0.3, 0)
    assert not found(0.9, 0.7, 0)
    assert not found(0.9, 0.3, 7000)


def _optimizer(implementation: str, per_param: float = 0.0) -> Measurements:
    return Measurements(
        optimizer=Optimizer(optimizers=["AdamW"], implementation=implementation, per_param_ops_per_step=per_param)
    )


def test_optimizer_for_loop_on_cpu_gets_foreach() -> None:
    rep = report(measurements=_optimizer("for_loop", 300), phases={"optimizer": 0.15})
    f = finding(rep, "optimizer.step")
    assert (f.category, f.severity, f.time_share) == ("optimizer", "warning", 0.15)
    assert f.evidence == {
        "optimizer_us_per_step": 1500.0,
        "recorded_optimizer_us_per_step": 1500.0,  # no profiler overhead measured: the same
        "optimizers": ["AdamW"],
        "implementation": "for_loop",
        "per_param_ops_per_step": 300,
        "foreach_ops_per_step": 0.0,
        "fused_ops_per_step": 0.0,
    }
    assert "per-parameter loop (300 small ops per step)" in f.title
    assert "torch.optim.AdamW(..., foreach=True)" in f.recommendation
    assert fixes(f) == {"foreach": ("optimizer_kwarg", True)}


def test_optimizer_fix_by_device_and_implementation() -> None:
    def optimizer_fixes(implementation: str, on_gpu: bool) -> dict[str, object]:
        rep = report(measurements=_optimizer(implementation), phases={"optimizer": 0.35}, device=gpu() if on_gpu else None)
        f = finding(rep, "optimizer.step")
        # With a switch to make, its saving; already fused, no saving is claimed (the time is in the title).
        assert (f.severity, f.time_share) == (("critical", 0.35) if f.fixes else ("info", None))
        return fixes(f)

    assert optimizer_fixes("for_loop", on_gpu=True) == {"fused": ("optimizer_kwarg", True)}
    assert optimizer_fixes("foreach", on_gpu=False) == {"fused": ("optimizer_kwarg", True)}
    assert optimizer_fixes("fused", on_gpu=True) == {}
    fused = finding(report(measurements=_optimizer("fused"), phases={"optimizer": 0.35}, device=gpu()), "optimizer.step")
    assert "(35.0% of the step) with the fused implementation" in fused.title
    assert "already runs fused" in fused.recommendation and "fused=True" not in fused.recommendation


def _cpu_optimizer(names: list[str], torch_version: str | None, implementation: str = "for_loop") -> dict[str, object]:
    """The optimizer.step finding of a CPU run (15 % of a 10 ms step) whose what-if model priced foreach
    at 0.5 .. 1.0 ms and fused at 1.0 .. 1.4 ms per step."""
    measurements = Measurements(
        optimizer=Optimizer(optimizers=names, implementation=implementation, per_param_ops_per_step=300),
        savings=Savings(
            model="host_critical_path",
            saved_us_per_step_low={"optimizer_step": 500.0, "optimizer_step_fused": 1000.0},
            saved_us_per_step_high={"optimizer_step": 1000.0, "optimizer_step_fused": 1400.0},
        ),
    )
    manifest = {"torch_version": torch_version} if torch_version else None
    f = finding(report(measurements=measurements, phases={"optimizer": 0.15}, manifest=manifest), "optimizer.step")
    return {"fixes": [fix.target for fix in f.fixes], "share": (f.time_share_low, f.time_share, f.time_share_high), "text": f.recommendation}


def test_cpu_optimizer_loop_gets_fused_first_where_this_torch_has_its_cpu_kernel() -> None:
    for names in (["Adam"], ["AdamW"], ["SGD"], ["Adagrad"], ["Adam", "SGD"]):
        got = _cpu_optimizer(names, "2.13.0+cpu")
        assert got["fixes"] == ["fused", "foreach"], names  # preference order, both tune candidates
        assert got["share"] == pytest.approx((0.10, 0.12, 0.14))  # the fused model's 1.0 .. 1.4 ms of 10
        assert "fused=True" in str(got["text"]) and "foreach=True is the fallback" in str(got["text"])
    assert _cpu_optimizer(["Adam"], "2.4.0")["fixes"] == ["fused", "foreach"]


def test_cpu_optimizer_loop_gets_foreach_without_a_cpu_fused_kernel() -> None:
    # Before 2.4, an optimizer class with no CPU fused kernel, or a torch version nobody recorded.
    for names, version in ((["Adam"], "2.3.1"), (["RMSprop"], "2.13.0"), (["Adam", "NAdam"], "2.13.0"), (["Adam"], None), ([], "2.13.0")):
        got = _cpu_optimizer(names, version)
        assert got["fixes"] == ["foreach"], (names, version)
        assert got["share"] == pytest.approx((0.05, 0.075, 0.10))  # the foreach model's 0.5 .. 1.0 ms of 10
        assert "foreach=True" in str(got["text"])


def test_cpu_foreach_optimizer_gets_fused_unless_its_torch_has_no_cpu_kernel() -> None:
    assert _cpu_optimizer(["Adam"], "2.13.0", "foreach")["fixes"] == ["fused"]
    assert _cpu_optimizer(["Adam"], None, "foreach")["fixes"] == ["fused"]
    assert _cpu_optimizer(["Adam"], "2.3.0", "foreach")["fixes"] == []
    assert _cpu_optimizer(["RMSprop"], "2.13.0", "foreach")["fixes"] == []


def test_gpu_optimizer_fix_ignores_the_cpu_kernels() -> None:
    """On a GPU the finding keeps fused and the replayed `optimizer_step` cost, whatever torch version."""
    measurements = Measurements(
        optimizer=Optimizer(optimizers=["RMSprop"], implementation="for_loop", per_param_ops_per_step=300),
        savings=Savings(model="device_replay", saved_us_per_step_low={"optimizer_step": 200.0}, saved_us_per_step_high={"optimizer_step": 600.0}),
    )
    for version in ("2.13.0", "2.3.0"):
        f = finding(report(measurements=measurements, phases={"optimizer": 0.15}, device=gpu(), manifest={"torch_version": version}), "optimizer.step")
        assert [fix.target for fix in f.fixes] == ["fused"]
        assert (f.time_share_low, f.time_share_high) == pytest.approx((0.02, 0.06))
        assert "CPU kernel" not in f.recommendation


def test_optimizer_loop_is_reported_below_ten_percent_only_with_many_per_param_ops() -> None:
    small_loop = finding(report(measurements=_optimizer("for_loop", 50), phases={"optimizer": 0.02}), "optimizer.step")
    assert (small_loop.severity, small_loop.time_share) == ("info", 0.02)
    assert "optimizer.step" not in findings(report(measurements=_optimizer("for_loop", 49), phases={"optimizer": 0.09}))
    assert "optimizer.step" not in findings(report(measurements=_optimizer("foreach", 500), phases={"optimizer": 0.09}))


def test_zero_grad_filling_gradients() -> None:
    measurements = Measurements(optimizer=Optimizer(zero_grad_fill_ops_per_step=120, zero_grad_us_per_step=300))
    f = finding(report(measurements=measurements), "optimizer.zero_grad_fill")
    assert (f.category, f.severity, f.time_share) == ("optimizer", "info", 0.03)
    assert f.evidence == {"zero_fill_ops_per_step": 120, "zero_grad_us_per_step": 300}
    assert fixes(f) == {"optimizer.zero_grad": ("code_change", "optimizer.zero_grad(set_to_none=True)")}
    assert "optimizer.zero_grad_fill" not in findings(report(measurements=Measurements(optimizer=Optimizer(zero_grad_us_per_step=300))))
    # The optimizer phase ran 2x slower under the profiler: half the share, in the unprofiled 6 ms step.
    measurements.profiler_overhead = SLOWED
    slowed = finding(report(measurements=measurements, phases={"forward": 0.35, "backward": 0.5, "optimizer": 0.15}), "optimizer.zero_grad_fill")
    assert slowed.time_share == pytest.approx(0.015)
    assert slowed.evidence["zero_grad_us_per_step"] == pytest.approx(0.015 * 6000.0)


def _outside(other: float, culprits: dict[str, float]) -> tuple[Measurements, dict[str, float]]:
    return Measurements(outside_steps=OutsideSteps(culprits_us_per_step=culprits)), {"other": other}


def test_outside_steps_names_its_culprits_and_claims_only_what_they_explain() -> None:
    measurements, phases = _outside(0.3, {"torch/serialization.py(400): save": 1500.0, "aten::item": 500.0})
    f = finding(report(measurements=measurements, phases=phases), "outside_steps.work")
    assert (f.category, f.severity, f.time_share) == ("outside_steps", "warning", 0.2)
    assert f.evidence == {
        "outside_us_per_step": 2000.0,
        "unattributed_other_us_per_step": 1000.0,
        "culprits_us_per_step": {"torch/serialization.py(400): save": 1500.0, "aten::item": 500.0},
    }
    assert "write checkpoints every N steps" in f.recommendation and "log metrics every N steps" in f.recommendation
    assert f.fixes == []


def test_outside_steps_below_five_percent_or_beyond_the_other_phase() -> None:
    measurements, phases = _outside(0.3, {"evaluate": 400.0})
    assert "outside_steps.work" not in findings(report(measurements=measurements, phases=phases))
    measurements, phases = _outside(0.1, {"evaluate": 5000.0})
    assert finding(report(measurements=measurements, phases=phases), "outside_steps.work").time_share == 0.1


def test_periodic_work_is_advised_as_periodic() -> None:
    """An evaluation every 4th step: advice on its interval and its cost, not "run it every N steps"; the
    saving's low end is what doubling the interval keeps."""
    measurements, phases = _outside(0.5, {"evaluate (train.py:6)": 2400.0, "log_metrics (train.py:30)": 600.0})
    measurements.outside_steps.culprit_steps_share = {"evaluate (train.py:6)": 0.25, "log_metrics (train.py:30)": 1.0}
    measurements.outside_steps.model_calls_us_per_step = 2000.0
    f = finding(report(measurements=measurements, phases=phases, steps=8), "outside_steps.work")
    assert "evaluate (train.py:6) (in 25.0% of the steps)" in f.title
    assert "runs in 25.0% of the recorded steps (9.6 ms each time, 2.4 ms per step on average)" in f.recommendation
    assert "torch.inference_mode() with larger batches" in f.recommendation
    assert "run evaluation every N steps" not in f.recommendation and "if it is evaluation" not in f.recommendation
    assert "log metrics every N steps" in f.recommendation  # the every-step culprit keeps its hint
    assert f.evidence["periodic_culprits_steps_share"] == {"evaluate (train.py:6)": 0.25}
    assert (f.time_share, f.time_share_low, f.time_share_high) == pytest.approx((0.3, 0.3 - 0.12, 0.3))
    # Two recorded steps tell no period: the every-step advice.
    f = finding(report(measurements=measurements, phases=phases, steps=2), "outside_steps.work")
    assert "run evaluation every N steps" in f.recommendation and "periodic_culprits_steps_share" not in f.evidence


def test_a_training_frameworks_own_work_gets_its_knobs_not_move_it_out() -> None:
    """Lightning's hooks and bookkeeping between the phases: code the user does not own, tuned through the
    framework; the user's own culprit beside it still gets the usual advice."""
    culprits = {"_call_lightning_module_hook (call.py:155)": 1400.0, "_call_strategy_hook (call.py:312)": 600.0}
    measurements, phases = _outside(0.3, culprits)
    measurements.outside_steps.framework_us_per_step = {"lightning": 2100.0}
    measurements.outside_steps.framework_culprits = [f"lightning: {name}" for name in culprits]
    f = finding(report(measurements=measurements, phases=phases), "outside_steps.work")
    assert f.recommendation.startswith("2.0 ms of it is Lightning's own per-step work (its hooks, logging and bookkeeping: "
                                       "_call_lightning_module_hook (call.py:155), _call_strategy_hook (call.py:312))")
    assert "log_every_n_steps" in f.recommendation and "Move this work" not in f.recommendation
    measurements.outside_steps.culprits_us_per_step["save_checkpoint (train.py:40)"] = 900.0
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "Lightning's own per-step work" in text and "Move this work out of the per-step path: write checkpoints every N steps" in text
    # A framework's minor share (under half of the explained time) changes nothing.
    measurements.outside_steps.framework_us_per_step = {"lightning": 500.0}
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "Lightning" not in text and text.startswith("Move this work out of the per-step path")
    # An unknown framework is named, with no knobs.
    measurements.outside_steps.framework_us_per_step = {"ignite": 2100.0}
    measurements.outside_steps.framework_culprits = [f"ignite: {name}" for name in culprits]
    assert "ignite's own per-step work" in finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation


def test_a_frameworks_share_leaves_out_its_gradient_clipping_and_other_frameworks_culprits() -> None:
    """A Hugging Face Trainer: 1300 us of its 1700 us is gradient clipping, which belongs to every step;
    the Trainer's movable work is then no majority, and accelerate's frame is not the Trainer's."""
    culprits = {"_clip_grad_norm (trainer.py:2781)": 1300.0, "floating_point_ops (trainer.py:4224)": 300.0,
                "is_lomo_available (imports.py:112)": 100.0, "save_checkpoint (train.py:40)": 900.0}  # fmt: skip
    measurements, phases = _outside(0.3, culprits)
    measurements.outside_steps.framework_us_per_step = {"transformers": 1600.0, "accelerate": 100.0}
    measurements.outside_steps.framework_culprits = [
        "transformers: _clip_grad_norm (trainer.py:2781)", "transformers: floating_point_ops (trainer.py:4224)",
        "accelerate: is_lomo_available (imports.py:112)",
    ]
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "Hugging Face Trainer" not in text and "Gradient clipping (_clip_grad_norm (trainer.py:2781))" in text
    del measurements.outside_steps.culprits_us_per_step["save_checkpoint (train.py:40)"]
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert text.startswith("300 us of it is the Hugging Face Trainer's own per-step work (its hooks, logging and "
                           "bookkeeping: floating_point_ops (trainer.py:4224))")


@pytest.mark.parametrize(
    ("frame", "framework"),
    [
        ("lightning/pytorch/trainer/call.py(312): _call_strategy_hook", "lightning"),
        ("/opt/conda/lib/python3.11/site-packages/transformers/trainer.py(2410): _inner_training_loop", "transformers"),
        ("accelerate/accelerator.py(2200): backward", "accelerate"),
        ("train.py(12): main", None),
        ("/home/me/lightning/train.py(3): main", None),  # the user's folder named like a framework
        ("composer/metrics.py(3): log_metrics", None),  # a user's package beside the script, not installed here
        ("composer/trainer/trainer.py(2100): _train_batch", "composer"),
        ("torch/optim/adam.py(213): step", None),
        ("<built-in method item of Tensor object at 0x7f>", None),
    ],
)
def test_training_frameworks_are_read_from_the_frames_path(frame: str, framework: str | None) -> None:
    assert training_framework(frame) == framework


def test_gradient_clipping_is_not_told_to_move_out_of_the_step() -> None:
    # Hugging Face's Trainer clips every step, outside the forward/backward/optimizer phases.
    measurements, phases = _outside(0.3, {"_clip_grad_norm (trainer.py:2781)": 1300.0, "floating_point_ops (trainer.py:4224)": 400.0})
    f = finding(report(measurements=measurements, phases=phases), "outside_steps.work")
    text = f.recommendation
    assert "Gradient clipping (_clip_grad_norm (trainer.py:2781)) belongs to every step" in text and "foreach=True" in text
    assert text.startswith("Move this work out of the per-step path: run it every N steps")  # the other culprit
    assert f.time_share == pytest.approx(0.04)  # what moving the other culprit saves: 400 us; the clipping stays
    measurements, phases = _outside(0.3, {"clip_grad_norm_ (clip_grad.py:30)": 2000.0})
    f = finding(report(measurements=measurements, phases=phases), "outside_steps.work")
    assert f.recommendation.startswith("Gradient clipping") and "Move this work" not in f.recommendation
    assert f.time_share is None  # clipping alone: nothing to move; foreach's saving is not modelled
    # It already runs the foreach norm (the default where the device has the kernels): nothing left to advise
    # for the clipping alone; beside another culprit, no foreach=True advice, and on a CPU those kernels loop
    # over the tensors (a 60-block MLP: 5.39 ms steps with foreach=True, 5.41 without).
    measurements.outside_steps.foreach_norm_culprits = ["clip_grad_norm_ (clip_grad.py:30)"]
    assert "outside_steps.work" not in findings(report(measurements=measurements, phases=phases))
    measurements.outside_steps.culprits_us_per_step["sleep"] = 1500.0
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "already takes the multi-tensor path" in text and "foreach=True" not in text and "on a CPU" in text
    # The op under another culprit (a gradient norm logged, an optimizer's) says nothing of the clipping's path.
    measurements.outside_steps.foreach_norm_culprits = ["log_grad_norm (train.py:40)"]
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "foreach=True" in text


def test_outside_steps_hints_come_from_the_culprits_that_matter() -> None:
    measurements, phases = _outside(0.3, {"sleep": 3000.0, "Tensor.item": 13.0})
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert "log metrics" not in text and "run it every N steps or in a background thread" in text
    measurements, phases = _outside(0.3, {"sleep": 2000.0, "Tensor.item": 400.0})  # 17 % of what is explained
    assert "log metrics" in finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation


@pytest.mark.parametrize(
    ("culprit", "hint"),
    [
        ("save (serialization.py:400)", ["write checkpoints"]),
        ("dump (pickle.py:480)", ["write checkpoints"]),
        ("save_checkpoint (train.py:26)", ["write checkpoints"]),
        ("Tensor.item", ["log metrics"]),
        ("aten::_local_scalar_dense", ["log metrics"]),
        ("log_metrics (train.py:80)", ["log metrics"]),
        ("evaluate (train.py:90)", ["run evaluation"]),
        # Hugging Face's Trainer checks every step whether to log, save or evaluate.
        ("_maybe_log_save_evaluate (trainer.py:2238)", ["write checkpoints", "log metrics", "run evaluation"]),
        # A module call outside the phases: the capture leaves no-grad model calls unlabelled after training.
        ("nn.Module: Sequential_0", ["a model call without gradients"]),
        ("__call__ (eval_frame.py:499)", []),  # torch._dynamo's frame evaluation, not an evaluation
        ("compute_logits (model.py:12)", []),  # logits, not logging
        ("saved_tensors_hooks (graph.py:300)", []),
        ("ema_update (train.py:12)", ["moving average"]),  # a weights' EMA: one multi-tensor op per step
        ("update (model_ema.py:120)", []),  # the file alone says nothing of what the call does
        ("update_parameters (swa_utils.py:250)", []),
        ("ModelEmaV2.update (timm/utils/model_ema.py:120)", ["moving average"]),
        ("average_gradients (train.py:40)", []),  # the DDP tutorial's all-reduce helper, no EMA
    ],
)
def test_outside_steps_hints_read_the_words_of_the_call(culprit: str, hint: list[str]) -> None:
    measurements, phases = _outside(0.3, {culprit: 2000.0})
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    hints = ("write checkpoints", "log metrics", "run evaluation", "moving average", "a model call without gradients")
    assert [h for h in hints if h in text] == hint


@pytest.mark.parametrize(
    ("culprit", "source"),
    [
        ("batches (train.py:5)", True),  # a generator the loop iterates with `for`: its frame, no next() call
        ("get_batch (train.py:116)", True),  # nanoGPT's
        ("load_data (prep.py:9)", True),
        ("load_checkpoint (train.py:40)", False),  # a checkpoint, not a batch
        ("evaluate_batch (train.py:90)", False),
        ("on_batch_end (logger_connector.py:211)", False),  # Lightning's callback hook: it runs at a batch
        ("on_train_batch_start (callback.py:7)", False),
        ("_on_before_batch_transfer (module.py:355)", False),
        ("sleep", False),
    ],
)
def test_outside_steps_names_the_loops_batch_source(culprit: str, source: bool) -> None:
    measurements, phases = _outside(0.3, {culprit: 2000.0})
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert ("looks like the loop's batch source" in text) is source
    assert ("Move this work out of the per-step path" in text) is not source


@pytest.mark.parametrize(
    ("culprit", "tokenizes"),
    [
        ("__call__ (tokenization_utils_base.py:2458)", True),  # a Hugging Face tokenizer called on a batch of text
        ("encode_batch (tokenizers/implementations/base_tokenizer.py:90)", True),
        ("tokenize (train.py:31)", True),  # the user's own
        ("encode (vae.py:12)", False),  # an image encoder is no tokenizer
        ("__call__ (transforms.py:95)", False),
        ("batch_decode (tokenization_utils_base.py:3800)", False),  # decoding samples to log them
        ("save_pretrained (tokenization_utils_base.py:2400)", False),
        ("evaluate (finetune_pretokenized.py:88)", False),  # the script's name says nothing of the call
        ("_batch_encode_plus (tokenization_utils_fast.py:512)", True),
    ],
)
def test_outside_steps_tells_tokenization_to_move_ahead_or_into_workers(culprit: str, tokenizes: bool) -> None:
    measurements, phases = _outside(0.3, {culprit: 2000.0})
    text = finding(report(measurements=measurements, phases=phases), "outside_steps.work").recommendation
    assert ("tokenizes text inside the step" in text) is tokenizes
    assert ("Move this work out of the per-step path" in text) is not tokenizes


def _sync(by_op: dict[str, float], sites: dict[str, float]) -> Measurements:
    return Measurements(sync=Synchronization(syncs_per_step=3, sync_us_per_step=sum(by_op.values()), by_op=by_op, call_sites=sites))


def test_synchronization_leaves_copy_syncs_to_h2d_copy() -> None:
    sites = {"train.py(57): train_step": 1500.0}
    rep = report(measurements=_sync({"aten::item": 1500.0, "aten::to": 400.0}, sites), device=gpu())
    f = finding(rep, "synchronization.host_device")
    assert (f.category, f.severity, f.time_share) == ("synchronization", "warning", 0.15)
    assert f.title.endswith("mostly in aten::item")
    assert f.evidence == {
        "syncs_per_step_incl_copies": 3,
        "sync_us_per_step": 1500.0,
        "by_op_us_per_step": {"aten::item": 1500.0},
        "call_sites_us_per_step": sites,
    }
    assert "Call sites: train.py(57): train_step." in f.recommendation
    assert fixes(f) == {
        "Tensor.item": ("code_change", "running_loss += loss.detach()"),
        "torch.cuda.set_sync_debug_mode": ("torch_flag", "warn"),
    }


def test_synchronization_thresholds() -> None:
    small = finding(report(measurements=_sync({"aten::item": 200.0}, {}), device=gpu()), "synchronization.host_device")
    assert (small.severity, small.time_share) == ("info", 0.02)
    assert finding(report(measurements=_sync({"aten::item": 300.0}, {}), device=gpu()), "synchronization.host_device").severity == "warning"
    assert "synchronization.host_device" not in findings(report(measurements=_sync({"aten::to": 400.0}, {}), device=gpu()))
    assert "synchronization.host_device" not in findings(report(measurements=_sync({"aten::item": 400.0}, {})))


# The capture timed 30 unprofiled steps at 6 ms against the recorded 10 ms; the Python-heavy optimizer ran
# 3x slower under the profiler (15 % recorded, 7.5 % of the unprofiled step), forward/backward 1.5x.
SLOWED = ProfilerOverhead(
    method="step_clock", unprofiled_step_us=6000.0, profiled_step_us=10_000.0,
    corrected_percent={"forward": 45.0, "backward": 47.5, "optimizer": 7.5},
)


def test_optimizer_cost_is_stated_without_the_profilers_overhead() -> None:
    measurements = Measurements(
        optimizer=Optimizer(optimizers=["Adam"], implementation="for_loop", per_param_ops_per_step=300),
        savings=Savings(
            model="host_critical_path",
            saved_us_per_step_low={"optimizer_step_fused": 1000.0}, saved_us_per_step_high={"optimizer_step_fused": 1400.0},
        ),
        profiler_overhead=SLOWED,
    )
    phases = {"forward": 0.35, "backward": 0.5, "optimizer": 0.15}
    f = finding(report(measurements=measurements, phases=phases, manifest={"torch_version": "2.13.0"}), "optimizer.step")
    scale = 7.5 / 15.0
    assert (f.time_share_low, f.time_share, f.time_share_high) == pytest.approx((0.10 * scale, 0.12 * scale, 0.14 * scale))
    assert f.evidence["optimizer_us_per_step"] == pytest.approx(450.0)  # 7.5 % of the unprofiled 6 ms
    assert f.evidence["recorded_optimizer_us_per_step"] == pytest.approx(1500.0)
    assert "takes 450 us of host time" in f.title
    # Below the 10 % threshold once the overhead is out, a foreach step is no finding at all.
    assert "optimizer.step" in findings(report(measurements=Measurements(
        optimizer=Optimizer(optimizers=["Adam"], implementation="foreach")), phases=phases))
    assert "optimizer.step" not in findings(report(measurements=Measurements(
        optimizer=Optimizer(optimizers=["Adam"], implementation="foreach"), profiler_overhead=SLOWED), phases=phases))


def test_python_gaps_are_stated_without_the_profilers_overhead() -> None:
    phases = {"forward": 0.5, "backward": 0.5}
    slowed = ProfilerOverhead(method="step_clock", unprofiled_step_us=6000.0, profiled_step_us=10_000.0,
                              corrected_percent={"forward": 40.0, "backward": 40.0, "other": 20.0})
    measurements = _dispatch(50, 100, 3000)
    measurements.profiler_overhead = slowed
    f = finding(report(measurements=measurements, phases=phases), "host_overhead.python")
    assert f.time_share == pytest.approx(0.3 * 0.8)  # 30 % recorded; forward+backward 80 of their 100 %
    assert "Python runs 1.4 ms per step" in f.title  # 24 % of the unprofiled 6 ms
    # Not measured, or no slower than the rest: the recorded share stands.
    assert finding(report(measurements=_dispatch(50, 100, 3000), phases=phases), "host_overhead.python").time_share == pytest.approx(0.3)


def test_outside_steps_hint_for_model_calls_under_a_culprit() -> None:
    # `sum(model(x) ... for x in val)`: the culprits are `sum` and the generator, the time is the model's.
    culprits = {"sum": 3000.0, "<genexpr> (train.py:14)": 2900.0}
    measurements = Measurements(outside_steps=OutsideSteps(culprits_us_per_step=culprits, model_calls_us_per_step=2700.0))
    f = finding(report(measurements=measurements, phases={"other": 0.3}), "outside_steps.work")
    assert "a model call without gradients" in f.recommendation and f.evidence["model_calls_us_per_step"] == 2700.0
    small = Measurements(outside_steps=OutsideSteps(culprits_us_per_step=culprits, model_calls_us_per_step=100.0))
    assert "a model call" not in finding(report(measurements=small, phases={"other": 0.3}), "outside_steps.work").recommendation


def test_outside_steps_names_the_culprits_that_matter() -> None:
    # A generator's 1.57 ms beside an embedding's 40 us and a tracer check: the title names the first
    # alone (the second is under a tenth), the evidence lists what holds a hundredth.
    culprits = {"next": 1570.0, "nn.Module: Embedding_0": 40.0, "_get_tracing_state": 0.4}
    measurements, phases = _outside(0.2, culprits)
    f = finding(report(measurements=measurements, phases=phases), "outside_steps.work")
    assert f.title.endswith("mostly in next")
    assert f.evidence["culprits_us_per_step"] == {"next": 1570.0, "nn.Module: Embedding_0": 40.0}


def test_anomaly_mode_cost_from_its_checks_and_saved_stacks() -> None:
    """The stacks (Python) are scaled as the forward is; the checks (native ops) lie between their share
    scaled as the backward is and their recorded time over the unprofiled step."""
    phases = {"forward": 0.4, "backward": 0.5, "optimizer": 0.1}
    slowed = ProfilerOverhead(method="step_clock", unprofiled_step_us=5000.0, profiled_step_us=10_000.0,
                              corrected_percent={"forward": 30.0, "backward": 50.0, "optimizer": 20.0})
    measurements = Measurements(
        anomaly=AnomalyMode(nan_checks_per_step=15, nan_check_us_per_step=1000.0, stack_captures_per_step=10,
                            stack_capture_us_per_step=2000.0),
        profiler_overhead=slowed,
    )
    f = finding(report(measurements=measurements, phases=phases), "host_overhead.anomaly_mode")
    assert (f.category, f.severity) == ("host_overhead", "critical")
    stacks = 0.2 * 30 / 40  # 2 of 10 ms recorded, the forward 30 % of its recorded 40 %
    low, high = stacks + 0.1 * 1.0, stacks + 1000 / 5000  # backward 50 of 50 %; 1 ms of the unprofiled 5 ms
    assert (f.time_share_low, f.time_share_high) == pytest.approx((low, high))
    assert f.time_share == pytest.approx((low + high) / 2)
    assert "15 NaN checks and 10 stacks saved per step" in f.title
    assert fixes(f) == {"torch.autograd.set_detect_anomaly": ("code_change", "torch.autograd.set_detect_anomaly(False)")}
    assert "Not measured" not in f.recommendation
    # Without stacks only the checks are measured, and the finding says so; not measured, the recorded share.
    measurements = Measurements(anomaly=AnomalyMode(nan_checks_per_step=15, nan_check_us_per_step=1000.0))
    f = finding(report(measurements=measurements, phases=phases), "host_overhead.anomaly_mode")
    assert (f.time_share, f.severity) == (pytest.approx(0.1), "warning")
    assert "stacks it saves for each autograd node" in f.recommendation and "with_stack=True" in f.recommendation


def test_anomaly_mode_from_the_manifest_alone_has_no_cost() -> None:
    """check_nan=False and no stacks: nothing in the trace, the capture saw it on at a step boundary."""
    f = finding(report(manifest={"environment": {"anomaly_mode": True}}), "host_overhead.anomaly_mode")
    assert f.time_share is None and f.severity == "warning"
    assert "its cost is not measured in this trace" in f.title
    assert "check_nan=False" in f.recommendation
    assert "host_overhead.anomaly_mode" not in findings(report(manifest={"environment": {"anomaly_mode": False}}))
    assert "host_overhead.anomaly_mode" not in findings(report())


def test_anomaly_checks_syncs_are_not_the_sync_finding() -> None:
    """On a GPU each check's .item() syncs: those syncs belong to the anomaly finding, not to the
    advice to remove .item() from the loop."""
    sync = Synchronization(syncs_per_step=16, sync_us_per_step=1700.0, by_op={ANOMALY_CHECK: 1500.0, "aten::item": 200.0})
    measurements = Measurements(sync=sync, anomaly=AnomalyMode(nan_checks_per_step=15, nan_check_us_per_step=1800.0))
    result = report(measurements=measurements, device=gpu())
    assert finding(result, "synchronization.host_device").evidence["by_op_us_per_step"] == {"aten::item": 200.0}
    f = finding(result, "host_overhead.anomaly_mode")
    assert "one synchronisation per backward node" in f.recommendation
    # The syncs' part without a what-if model: their measured share; the rest of the checks (300 us) as is.
    assert f.time_share == pytest.approx(0.18)
    only_checks = Measurements(sync=Synchronization(syncs_per_step=15, sync_us_per_step=1500.0, by_op={ANOMALY_CHECK: 1500.0}),
                               anomaly=AnomalyMode(nan_checks_per_step=15, nan_check_us_per_step=1800.0))
    assert "synchronization.host_device" not in findings(report(measurements=only_checks, device=gpu()))


def test_gc_pauses_from_the_step_clock() -> None:
    """Full collections: gc.freeze() spares most of them (half, at the low end); the young ones at best
    (gc.disable in the loop): the high end is all of it. Shares of the unprofiled steps' mean."""
    section = GarbageCollection(unprofiled_steps=30, unprofiled_step_mean_us=20_000.0, unprofiled_gc_us_per_step=3000.0,
                                unprofiled_full_gc_us_per_step=2000.0, unprofiled_collections_per_step=40,
                                unprofiled_longest_pause_us=60_000.0)
    f = finding(report(measurements=Measurements(gc=section)), "host_overhead.gc_pauses")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.05, 0.15))
    assert f.time_share == pytest.approx(0.10) and f.severity == "warning"
    assert "takes 15.0% of the step, 10.0% in full collections (longest pause 60.0 ms)" in f.title
    assert fixes(f) == {"gc.freeze": ("code_change", "gc.freeze()")}
    assert "gc.collect()" not in f.recommendation.split(".")[0]
    # Small and short: no finding; one long pause is reported even when rare.
    small = msgspec.structs.replace(section, unprofiled_gc_us_per_step=200.0, unprofiled_full_gc_us_per_step=0.0,
                                    unprofiled_longest_pause_us=400.0)
    assert "host_overhead.gc_pauses" not in findings(report(measurements=Measurements(gc=small)))
    rare = msgspec.structs.replace(small, unprofiled_longest_pause_us=1500.0)
    assert "host_overhead.gc_pauses" in findings(report(measurements=Measurements(gc=rare)))


def test_gc_pauses_from_the_trace_and_explicit_collections() -> None:
    """Without the clock, the recorded collections (no generation known): from none saved to all of them."""
    section = GarbageCollection(collections_per_step=3, explicit_collections_per_step=1, gc_us_per_step=1000.0,
                                long_pauses_per_step=0, longest_pause_us=600.0)
    f = finding(report(measurements=Measurements(gc=section)), "host_overhead.gc_pauses")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.0, 0.10))
    assert f.evidence["full_gc_share"] is None and f.evidence["explicit_collections_per_step"] == 1
    assert f.recommendation.startswith("1 collection(s) per step are the script's own gc.collect()")
    assert "host_overhead.gc_pauses" not in findings(report())


def test_launch_blocking_named_from_the_environment() -> None:
    """CUDA_LAUNCH_BLOCKING=1 recorded by the capture, on a trace too short to judge its launches."""
    environment = {"environment": {"cuda_launch_blocking": True}}
    measurements = Measurements(launch=LaunchOverhead(kernels_per_step=3, long_kernels_per_step=1, launch_wait_us_per_step=500.0))
    f = finding(report(measurements=measurements, device=gpu(), manifest=environment), "synchronization.launch_blocking")
    assert f.evidence["cuda_launch_blocking_in_environment"] is True and f.time_share_high == pytest.approx(0.05)
    assert fixes(f) == {"CUDA_LAUNCH_BLOCKING": ("env_var", "0")}
    # Neither the setting nor enough long kernels to judge (1 per step x 4 steps): no finding.
    measurements.launch.blocking_launches_per_step = 1.0
    assert "synchronization.launch_blocking" not in findings(report(measurements=measurements, device=gpu()))
    assert "synchronization.launch_blocking" not in findings(report(measurements=measurements, manifest=environment))  # CPU run
    # Enough long kernels that did not wait: the trace's measurement outweighs the setting (set after CUDA
    # started, or for another process).
    measured = Measurements(launch=LaunchOverhead(long_kernels_per_step=20, blocking_launches_per_step=2.0, launch_wait_us_per_step=50.0))
    assert "synchronization.launch_blocking" not in findings(report(measurements=measured, device=gpu(), manifest=environment))


def test_module_hooks_cost_between_scaled_and_recorded() -> None:
    phases = {"forward": 0.5, "backward": 0.4, "optimizer": 0.1}
    slowed = ProfilerOverhead(method="step_clock", unprofiled_step_us=5000.0, profiled_step_us=10_000.0,
                              corrected_percent={"forward": 40.0, "backward": 40.0, "optimizer": 20.0})
    hooks = ModuleHooks(calls_per_step=9, hooks_us_per_step=1000.0, hooks_us_by_name={"record (train.py:4)": 1000.0})
    f = finding(report(measurements=Measurements(module_hooks=hooks, profiler_overhead=slowed), phases=phases), "host_overhead.module_hooks")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.1 * 80 / 90, 0.2), abs=1e-4)
    assert "Module hooks run 9 times per step" in f.title and "record (train.py:4)" in f.title
    assert [fix.target for fix in f.fixes] == ["nn.Module.register_forward_hook"]
    assert "waits for the device" not in f.recommendation
    assert "waits for the device" in finding(report(measurements=Measurements(module_hooks=hooks), device=gpu()), "host_overhead.module_hooks").recommendation
    small = ModuleHooks(calls_per_step=2, hooks_us_per_step=100.0, hooks_us_by_name={"f (a.py:1)": 100.0})
    assert "host_overhead.module_hooks" not in findings(report(measurements=Measurements(module_hooks=small)))


def _matmul_loop(rated: bool) -> Measurements:
    """A per-sample loop (500 tiny ops) whose what-if saving is 2-8 ms of a 10 ms step with its matmul
    units (4 ms, 0.04 GFLOP) kept in full at the low end and not at all at the high end, as the trace
    says when it holds no large matmul to read a rate from (`rated` False)."""
    measurements = _dispatch(500, 1500, 1000)
    measurements.dispatch.matmul_us_per_step = 4_000.0
    measurements.dispatch.matmul_gflop_per_step = 0.04
    if rated:
        measurements.dispatch.matmul_large_us_per_step, measurements.dispatch.matmul_large_gflop_per_step = 3_000.0, 0.09
    else:
        measurements.dispatch.matmul_unrated_us_per_step, measurements.dispatch.matmul_unrated_gflop_per_step = 4_000.0, 0.04
    measurements.patterns = Patterns(indexing_loop_iterations_per_step=64, indexing_loop_compute_us_per_step=500)
    measurements.savings = Savings(
        model="host_critical_path", saved_us_per_step_low={"dispatch": 2_000.0}, saved_us_per_step_high={"dispatch": 8_000.0}
    )
    return measurements


def test_dispatch_keeps_the_matmuls_flops_at_the_rate_measured_at_capture() -> None:
    """Without a large matmul in the trace, the units' kept time is their FLOPs at the capture's measured
    matmul rate (0.04 GFLOP at 40 GFLOP/s: 1 ms of their 4 ms), not all (low) .. none (high) of it."""
    manifest = {"environment": {"cpu_peak": {"matmul_gflops": 40.0, "threads": 2}}}
    f = finding(report(measurements=_matmul_loop(rated=False), manifest=manifest), "host_overhead.dispatch")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.50, 0.70))  # 2 + 4 - 1 ms, 8 - 1 ms
    # Without the capture's rate the trace cannot tell: the what-if range stands.
    f = finding(report(measurements=_matmul_loop(rated=False)), "host_overhead.dispatch")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.20, 0.80))
    # A trace with large matmuls already kept its units at their rate (30 GFLOP/s here): the capture's
    # rate does not replace it.
    measurements = _matmul_loop(rated=True)
    assert measurements.dispatch.matmul_large_gflops == pytest.approx(30.0)
    f = finding(report(measurements=measurements, manifest=manifest), "host_overhead.dispatch")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.20, 0.80))


def test_an_indexing_loop_saves_at_most_what_batching_the_forward_and_backward_saves() -> None:
    """A loop over chunks of large matmuls: 6 ms of forward in the loop (75-98 % of it without the
    batching model), but batching keeps the matmuls' arithmetic: 1-1.5 ms of the 10 ms step."""
    patterns = Patterns(indexing_loop_iterations_per_step=20, indexing_loop_us_per_step=6_000, indexing_loop_compute_us_per_step=6_000)
    savings = Savings(model="host_critical_path", saved_us_per_step_low={"dispatch": 1_000.0}, saved_us_per_step_high={"dispatch": 1_500.0})
    f = finding(report(measurements=Measurements(patterns=patterns, savings=savings)), "host_overhead.indexing_loop")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.10, 0.15))
    assert "run it once on the whole tensor" in f.recommendation
    f = finding(report(measurements=Measurements(patterns=patterns)), "host_overhead.indexing_loop")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.45, 0.588))
    # A loop outside forward/backward (data preparation, metrics) is not batching's to cap: 4 of its 6 ms.
    patterns.indexing_loop_compute_us_per_step = 2_000
    f = finding(report(measurements=Measurements(patterns=patterns, savings=savings)), "host_overhead.indexing_loop")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.10 + 0.30, 0.15 + 0.392))


def test_a_loop_of_model_calls_with_few_tiny_ops_is_costed_as_batching_it() -> None:
    """`for s in x: model(s)`: 16 forward passes a step whose tiny ops (150, under the 200 of a tiny-op
    run) and Python between them are 25 % of the step. host_overhead.dispatch costs batching it (the
    what-if's 4-6 ms), and neither the loop's own finding (its selects run between the calls, outside
    forward and backward) nor host_overhead.python repeats it. A loop inside one forward pass keeps its own
    finding beside it; under a tenth of the step the loop's own finding speaks alone."""
    measurements = _dispatch(150, 1000, 1500)
    measurements.dispatch.forward_passes_per_step = 16
    measurements.patterns = Patterns(indexing_loop_iterations_per_step=16, indexing_loop_us_per_step=30)
    measurements.savings = Savings(model="host_critical_path", saved_us_per_step_low={"dispatch": 4_000.0}, saved_us_per_step_high={"dispatch": 6_000.0})
    found = findings(report(measurements=measurements))
    assert "host_overhead.indexing_loop" not in found and "host_overhead.python" not in found
    f = found["host_overhead.dispatch"]
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.40, 0.60))
    assert f.evidence["indexing_loop_iterations_per_step"] == 16
    assert "fold the looped dimension into the batch" in f.recommendation
    # One forward pass: a loop outside forward/backward is not the model's, one inside it is.
    measurements.dispatch.forward_passes_per_step = 1
    assert "host_overhead.dispatch" not in findings(report(measurements=measurements))
    measurements.patterns.indexing_loop_compute_us_per_step = 30
    found = findings(report(measurements=measurements))
    assert {"host_overhead.dispatch", "host_overhead.indexing_loop"} <= set(found)
    measurements.dispatch = Dispatch(tiny_ops_per_step=150, tiny_op_us_per_step=300, python_gap_us_per_step=500, ops_per_step=800)
    found = findings(report(measurements=measurements))
    assert "host_overhead.dispatch" not in found and "host_overhead.indexing_loop" in found


def test_a_loop_outside_forward_and_backward_is_not_the_models_to_batch() -> None:
    """A per-element loop in data preparation (none of its time in forward/backward): a batched model with
    few tiny ops gets no host_overhead.dispatch from it (host_overhead.python and the loop's own finding
    stay), and a model of many tiny ops gets the torch.compile cost and text, not batching's, with the
    loop's own finding beside it."""
    savings = Savings(model="host_critical_path", saved_us_per_step_low={"dispatch": 4_000.0}, saved_us_per_step_high={"dispatch": 6_000.0})
    loop = Patterns(indexing_loop_iterations_per_step=16, indexing_loop_us_per_step=400)
    measurements = _dispatch(14, 300, 1_200)
    measurements.patterns, measurements.savings = loop, savings
    found = findings(report(measurements=measurements))
    assert "host_overhead.dispatch" not in found
    assert {"host_overhead.python", "host_overhead.indexing_loop"} <= set(found)
    measurements = _dispatch(500, 1500, 1000)
    measurements.patterns, measurements.savings = loop, savings
    found = findings(report(measurements=measurements))
    dispatch = found["host_overhead.dispatch"]
    assert (dispatch.time_share_low, dispatch.time_share_high) == pytest.approx((0.10, 0.25))  # gaps .. gaps + tiny ops
    assert "fold the looped dimension" not in dispatch.recommendation and "indexing_loop_iterations_per_step" not in dispatch.evidence
    assert found["host_overhead.indexing_loop"].time_share_high == pytest.approx(0.039, abs=1e-3)  # 400 us less 2 %


def test_an_optimizer_without_foreach_or_fused_gets_no_keyword() -> None:
    """LBFGS (and SparseAdam) have neither implementation: its own arithmetic is no per-parameter loop to
    replace, so the finding states its time and claims no saving (an LBFGS run under Lightning got
    'torch.optim.Adam(..., foreach=True)' at 63.8 % critical)."""
    for names in (["LBFGS"], ["SparseAdam"]):
        measurements = Measurements(optimizer=Optimizer(optimizers=names, implementation="for_loop", per_param_ops_per_step=300))
        f = finding(report(measurements=measurements, phases={"optimizer": 0.35}), "optimizer.step")
        assert (fixes(f), f.time_share, f.severity) == ({}, None, "info")
        assert f"{names[0]} has no foreach or fused implementation" in f.title and "per-parameter loop" not in f.title
        assert "foreach=True" not in f.recommendation and f"({names[0]}) has no foreach or fused" in f.recommendation
    # Under 10 % such an optimizer is not reported for its op count alone.
    measurements = Measurements(optimizer=Optimizer(optimizers=["LBFGS"], implementation="for_loop", per_param_ops_per_step=300))
    assert "optimizer.step" not in findings(report(measurements=measurements, phases={"optimizer": 0.05}))
