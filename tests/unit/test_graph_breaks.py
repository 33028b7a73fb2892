"""torch.compile graph breaks (analysis/graph_breaks.py, compute.graph_breaks) on synthetic traces built the
way a compiled training step records them, and the rule on hand-built Reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rules_support import finding, findings, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.graph_breaks import break_location
from torchscope.report.measurements import GraphBreaks, Measurements

STEP_US = 10_000.0


def _compiled_steps(graphs: int, resume: bool = True, second_model: bool = True, extras: bool = False,
                    gpu: bool = False) -> TraceBuilder:
    """3 steps. The model's compiled call: one region holding `graphs` CompiledFunction ranges of 500 us
    with 100 us of Python between them (dynamo's resume functions where `resume`); then, where
    `second_model`, another module compiled apart (one graph, its own region: a second call, no break)."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.op("Torch-Compiled Region: 0/0", t0 + 100, graphs * 600)
        for g in range(graphs):
            start = t0 + 150 + g * 600
            b.op("CompiledFunction", start, 500)
            if resume and g > 0:
                b.op("model.py(42): torch_dynamo_resume_in_forward_at_42", start - 50, 560, cat="python_function")
        if second_model:
            b.op("Torch-Compiled Region: 1/0", t0 + 6_000, 600)
            b.op("CompiledFunction", t0 + 6_050, 500)
        b.op("autograd::engine::evaluate_function: CompiledFunctionBackward", t0 + 7_000, 1_000)
        b.op("CompiledFunctionBackward", t0 + 7_010, 900)
        if extras:
            # Compiled regions without a training graph: torchscope's phase hook compiled on its own, and a
            # compiled optimizer step; compilation inside the model's region (a recompile).
            b.op("Torch-Compiled Region: 5/0", t0 + 50, 20)
            b.op("Torch-Compiled Region: 6/0", t0 + 8_500, 800)
            b.op("Optimizer.step#SGD.step", t0 + 8_400, 1_000, cat="user_annotation")
            b.op("compile_inner (dynamo_timed)", t0 + 120, 25)
        if gpu:  # the device busy through the whole forward: the host's gaps cost nothing
            b.launch(t0 + 110, 5, t0 + 100, 6_000)
    return b


def test_break_location_from_the_resume_function() -> None:
    assert break_location("model.py(42): torch_dynamo_resume_in_forward_at_42") == "forward (model.py:42)"
    assert break_location("/src/pkg/layers.py(7): torch_dynamo_resume_in__attn_at_118") == "_attn (layers.py:118)"


def test_graphs_calls_breaks_and_locations(tmp_path: Path) -> None:
    rep = torchscope.analyze(_compiled_steps(graphs=4).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.graph_breaks
    # 5 graphs in 2 compiled calls: the model's 4 (3 breaks) and the other model's 1 (none).
    assert (section.graphs_per_step, section.compiled_calls_per_step, section.breaks_per_step) == (5, 2, 3)
    assert section.locations == {"forward (model.py:42)": 3}
    # Between graphs: in the regions 4 x 600 - 4 x 500 + 600 - 500 us, and the backward graph's autograd
    # node around it (1,000 us around 900 us).
    assert section.between_graphs_us_per_step == pytest.approx(4 * 100 + 100 + 100, abs=1)


def test_regions_without_graphs_are_no_calls_and_compilation_is_no_gap(tmp_path: Path) -> None:
    rep = torchscope.analyze(_compiled_steps(graphs=4, extras=True).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.graph_breaks
    assert (section.graphs_per_step, section.compiled_calls_per_step, section.breaks_per_step) == (5, 2, 3)
    assert section.between_graphs_us_per_step == pytest.approx(4 * 100 + 100 - 25 + 100, abs=1)


def test_on_a_gpu_only_the_device_idle_time_between_graphs_counts(tmp_path: Path) -> None:
    rep = torchscope.analyze(_compiled_steps(graphs=4, gpu=True).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.graph_breaks
    assert section.time_base == "device_idle" and section.breaks_per_step == 3
    # The second model's last 50 us, and the backward node's 100 us, after the kernel.
    assert section.between_graphs_us_per_step == pytest.approx(150, abs=1)
    assert "compute.graph_breaks" not in {f.id for f in rep.findings}


def test_one_graph_per_call_is_no_break(tmp_path: Path) -> None:
    rep = torchscope.analyze(_compiled_steps(graphs=1).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.graph_breaks.breaks_per_step == 0
    assert "compute.graph_breaks" not in {f.id for f in rep.findings}


def test_no_compiled_graph_no_section(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        b.step(i, i * STEP_US, STEP_US)
        b.op("aten::mm", i * STEP_US + 10, 500)
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.graph_breaks == GraphBreaks()


def test_graphs_without_compiled_regions_no_section(tmp_path: Path) -> None:
    """A trace with compiled graphs but no dynamo region around them (its recording off or a PyTorch
    without it): no call to count breaks in, and no crash."""
    b = TraceBuilder()
    for i in range(3):
        b.step(i, i * STEP_US, STEP_US)
        b.op("CompiledFunction", i * STEP_US + 10, 500)
        b.op("CompiledFunction", i * STEP_US + 600, 500)
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.graph_breaks == GraphBreaks()


def _report(section: GraphBreaks) -> object:
    return report(measurements=Measurements(graph_breaks=section))


def test_rule_costs_the_breaks_share_of_the_time_between_graphs() -> None:
    step_us = report().steps[0].duration_us
    section = GraphBreaks(graphs_per_step=16, compiled_calls_per_step=1, breaks_per_step=15,
                          between_graphs_us_per_step=0.32 * step_us, locations={"forward (train.py:9)": 8})
    f = finding(_report(section), "compute.graph_breaks")
    assert f.time_share == pytest.approx(0.32 * 15 / 16, abs=1e-3)  # no step clock: recorded shares
    assert f.title.startswith("torch.compile breaks the graph 15 time(s) per step (16 graphs in 1 compiled call(s), at forward (train.py:9))")
    assert {fix.target for fix in f.fixes} == {"TORCH_LOGS", "torch.compile"}
    small = GraphBreaks(graphs_per_step=2, compiled_calls_per_step=1, breaks_per_step=1, between_graphs_us_per_step=0.01 * step_us)
    assert "compute.graph_breaks" not in findings(_report(small))


def test_ddp_bucket_graphs_without_resume_frames_are_no_break_finding() -> None:
    # Compiled DDP: DDPOptimizer splits the model into one graph per gradient bucket, leaving no resume
    # function; with one (a real break under DDP), the finding stands.
    step_us = report().steps[0].duration_us
    section = GraphBreaks(graphs_per_step=4, compiled_calls_per_step=1, breaks_per_step=3,
                          between_graphs_us_per_step=0.2 * step_us, ddp_forwards_per_step=1)
    assert "compute.graph_breaks" not in findings(_report(section))
    section.locations = {"forward (train.py:9)": 1}
    f = finding(_report(section), "compute.graph_breaks")
    assert f.title.startswith("torch.compile breaks the graph 1 time(s) per step")  # the bucket splits are not counted
    assert f.time_share == pytest.approx(0.2 * 1 / 4, abs=1e-3)
