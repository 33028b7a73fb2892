"""torch.compile's compilation (analysis/compilation.py, compute.recompiles, trace_quality.compilation_in_window)
on synthetic traces recorded the way PyTorch 2.x's dynamo and Inductor write them, and the rules on
hand-built Reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rules_support import finding, findings, fixes, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.compilation import frame_and_count
from torchscope.report.measurements import Compile, Measurements

STEP_US = 10_000.0


def _compiling(b: TraceBuilder, t0: float, compile_id: str, dur: float, data: bool = True) -> None:
    """A frame's compilation as dynamo records it: its outer phases and `(dynamo_timed)` ranges nested
    inside one another, and (recent releases: `data`) the `_data` annotations that name the compile id."""
    b.op("dynamo", t0, dur)
    b.op("entire_frame_compile", t0 + 5, dur - 10)
    b.op("_compile.compile_inner (dynamo_timed)", t0 + 6, dur - 12)
    b.op("compile_fx_inner (dynamo_timed)", t0 + 100, dur / 2)
    if data:
        b.annotation(f"dynamo_data: compile_id={compile_id}", t0 + 1, 1)
        b.annotation(f"compile_attempt_0_data: compile_id={compile_id}", t0 + 7, 1)


def _steps(ids: list[str | None], lengths: list[int], compile_us: float = 4_000.0, data: bool = True) -> TraceBuilder:
    """One step per id: the compiled call's region and its graph (`CompiledFunction`, input shapes
    recorded), compiled first (forward) where the id is given, with its lazy backward compilation inside the
    step's backward; a step without an id runs the last graph compiled."""
    b = TraceBuilder()
    region = "0/0"
    for i, (compile_id, length) in enumerate(zip(ids, lengths)):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        region = compile_id or region
        if compile_id:
            _compiling(b, t0 + 100, compile_id, compile_us, data)
        start = t0 + 200 + (compile_us if compile_id else 0)
        b.op(f"Torch-Compiled Region: {region}", start, 500)
        b.op("CompiledFunction", start + 20, 400, **{"Input Dims": [[8, length, 16], [32, 16], [32]], "Input type": ["float"] * 3})
        b.op("autograd::engine::evaluate_function: CompiledFunctionBackward", start + 1_000, 2_000)
        if compile_id:
            b.op("entire_backward_compile", start + 1_010, 1_000)
            if data:
                b.annotation(f"entire_backward_compile_data: fn_name=backward._backward_impl, compile_id={compile_id}", start + 1_011, 1)
            b.op("backward._backward_impl (dynamo_timed)", start + 1_020, 900)
        b.op("Python GC", start + 1_500, 200, cat="python_function")  # inside the backward compilation when there is one
    return b


def _analyze(b: TraceBuilder, tmp_path: Path) -> torchscope.Report:
    return torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)


def test_compile_ids() -> None:
    assert frame_and_count("0/3") == ("0", 3)
    # Compiled autograd: its A-th backward graph, whose own compilation is always a new frame's first.
    assert frame_and_count("!1/2/0") == ("compiled autograd", 1) and frame_and_count("!0") == ("compiled autograd", 0)
    assert frame_and_count("") is None and frame_and_count("Unknown") is None and frame_and_count("3") is None


def test_a_recompilation_every_step_with_the_input_dimension_that_varies(tmp_path: Path) -> None:
    rep = _analyze(_steps(["0/2", "0/3", "0/4"], [49, 65, 81]), tmp_path)
    section = rep.measurements.compile
    # Nested ranges counted once: the forward's 4,000 us and the backward's 1,000 us, not their sum.
    assert section.compilation_us_per_step == pytest.approx(5_000.0)
    assert section.recompilation_us_per_step == pytest.approx(5_000.0)
    assert (section.recompilations_per_step, section.recompiling_steps_share) == (1.0, 1.0)
    assert section.recompiled_ids == ["0/2", "0/3", "0/4"]
    assert section.varying_inputs == ["frame 0, input 0 dim 1: 49, 65, 81"]
    assert section.compiled_regions_per_step == 1.0  # one compiled call a step, not one per marker
    # The collections inside the compilation are its cost, not a GC pause of the step's.
    assert rep.measurements.gc.collections_per_step == 0.0
    f = finding(rep, "compute.recompiles")
    assert f.title.startswith("torch.compile recompiles in 100.0% of the steps (0/2, 0/3, 0/4): 5.0 ms per step compiling")
    assert "frame 0, input 0 dim 1: 49, 65, 81" in f.recommendation and "mark_dynamic" in f.recommendation
    assert set(fixes(f)) == {"torch._dynamo.mark_dynamic", "torch.compile", "TORCH_LOGS"}
    # The same time is not reported again as a compilation caught by the profiling window.
    assert "trace_quality.compilation_in_window" not in findings(rep)


def test_ids_from_the_regions_where_a_release_writes_no_data_annotations(tmp_path: Path) -> None:
    # Without `_data` annotations, the first call of a new graph after a compilation names it.
    section = _analyze(_steps(["0/2", "0/3", "0/4"], [49, 65, 81], data=False), tmp_path).measurements.compile
    assert section.recompiled_ids == ["0/2", "0/3", "0/4"] and section.recompiling_steps_share == 1.0
    # Only the forward's compilation is named so (the backward's is followed by no new region).
    assert section.recompilation_us_per_step == pytest.approx(4_000.0)


def test_compiled_autograd_captures_after_the_first_are_recompilations(tmp_path: Path) -> None:
    # Each new backward graph: a `compiled_autograd` capture (id !A), its graph compiled as a new frame (!A/F/0).
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.op("compiled_autograd", t0 + 3_000, 1_500)
        b.annotation(f"compiled_autograd_data: compile_id=!{i + 2}", t0 + 3_001, 1)
        _compiling(b, t0 + 3_100, f"!{i + 2}/{i + 3}/0", 1_000)
    section = _analyze(b, tmp_path).measurements.compile
    assert section.recompiled_ids == ["!2", "!3", "!4"] and section.recompilations_per_step == 1.0
    assert section.recompilation_us_per_step == pytest.approx(1_500.0) and section.recompiling_steps_share == 1.0


def test_calls_are_the_outermost_regions_and_compilation_is_clipped_to_the_steps(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(2):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.op("Torch-Compiled Region: 0/0", t0 + 100, 2_000)
        b.op("Torch-Compiled Region: 1/0", t0 + 900, 500)  # a graph break's resumed frame, inside the call
    b.op("dynamo", 2 * STEP_US - 1_000, 3_000)  # compiling across the last step's end: 1,000 us inside
    section = _analyze(b, tmp_path).measurements.compile
    assert section.compiled_regions_per_step == 1.0
    assert section.compilation_us_per_step == pytest.approx(1_000.0 / 2)


def test_warm_up_compilations_are_no_recompilation_finding(tmp_path: Path) -> None:
    # A first compilation, then dynamo's automatic dynamic shapes recompiling once: warm-up in the window.
    rep = _analyze(_steps(["0/0", "0/1", None, None], [17, 33, 49, 65]), tmp_path)
    section = rep.measurements.compile
    assert section.recompiled_ids == ["0/1"] and section.recompiling_steps_share == 0.25
    assert section.varying_inputs == ["frame 0, input 0 dim 1: 17, 33"]  # each graph's first call
    assert "compute.recompiles" not in findings(rep)
    f = finding(rep, "trace_quality.compilation_in_window")
    assert f.evidence["compilation_us_per_step"] == pytest.approx(2 * 5_000.0 / 4)
    # Steps without compilation: the collections are the step's own.
    assert rep.measurements.gc.collections_per_step == pytest.approx(0.5)


def test_anomaly_stack_captures_while_compiling_are_compilations(tmp_path: Path) -> None:
    # AOTAutograd traces the backward under detect_anomaly(check_nan=False): its stack captures sit inside
    # the compilation; the same capture outside it is the user's anomaly mode.
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        _compiling(b, t0 + 100, f"0/{i + 1}", 4_000)
        b.op("aten::addmm", t0 + 1_000, 50)
        b.op("torch/fx/traceback.py(80): format_stack", t0 + 1_010, 20, cat="python_function")
    assert _analyze(b, tmp_path).measurements.anomaly.stack_captures_per_step == 0
    b.op("aten::addmm", 6_000, 50)
    b.op("torch/fx/traceback.py(80): format_stack", 6_010, 20, cat="python_function")
    assert _analyze(b, tmp_path).measurements.anomaly.stack_captures_per_step == pytest.approx(1 / 3)


def _compiled(**fields: float | list[str]) -> Measurements:
    return Measurements(compile=Compile(**fields))  # type: ignore[arg-type]


def test_recompiles_rule() -> None:
    steady = _compiled(compilation_us_per_step=6_000.0, recompilation_us_per_step=6_000.0, recompilations_per_step=1.0,
                       recompiling_steps_share=1.0, recompiled_ids=["0/2", "0/3", "0/4", "0/5"])
    f = finding(report(measurements=steady), "compute.recompiles")
    assert (f.severity, f.time_share) == ("critical", 0.6)
    assert f.evidence == {"recompilations_per_step": 1.0, "recompilation_us_per_step": 6_000.0, "recompiling_steps_share": 1.0,
                          "recompiled_ids": ["0/2", "0/3", "0/4", "0/5"]}
    # No input shape known to vary: the advice is to find out which guard fails, the one fix as data.
    assert "TORCH_LOGS=recompiles" in f.recommendation and fixes(f) == {"TORCH_LOGS": ("env_var", "recompiles")}
    assert "trace_quality.compilation_in_window" not in findings(report(measurements=steady))
    # One recompilation id, even in every step of a short window (or on every rank): warm-up.
    single = _compiled(compilation_us_per_step=3_000.0, recompilation_us_per_step=3_000.0, recompilations_per_step=1.0,
                       recompiling_steps_share=1.0, recompiled_ids=["0/1"])
    assert "compute.recompiles" not in findings(report(measurements=single, steps=1))
    # One recompilation in the window, or in only one step of four: warm-up, the window's finding.
    once = _compiled(compilation_us_per_step=1_500.0, recompilation_us_per_step=1_500.0, recompilations_per_step=0.25,
                     recompiling_steps_share=0.25, recompiled_ids=["0/1"])
    assert "compute.recompiles" not in findings(report(measurements=once))
    assert finding(report(measurements=once), "trace_quality.compilation_in_window").evidence == {"compilation_us_per_step": 1_500.0}
    # A first compilation beside steady recompilations: the window's finding keeps the first one's time.
    both = _compiled(compilation_us_per_step=8_000.0, recompilation_us_per_step=6_000.0, recompilations_per_step=1.0,
                     recompiling_steps_share=1.0, recompiled_ids=["0/2", "0/3", "0/4", "0/5"])
    assert finding(report(measurements=both), "trace_quality.compilation_in_window").time_share == pytest.approx(0.2)
    assert finding(report(measurements=both), "compute.recompiles").time_share == pytest.approx(0.6)
