"""Dropout on the CPU (analysis/dropout.py, compute.dropout): synthetic traces recorded the way a CPU
training step records dropout (aten::dropout > aten::bernoulli_, aten::mul), and the rule on hand-built
Reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rules_support import finding, findings, fixes, gpu, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.report.measurements import Dropout, Measurements

STEP_US = 10_000.0


def _steps(gpu_trace: bool = False) -> TraceBuilder:
    b = TraceBuilder().gpu() if gpu_trace else TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.op("aten::linear", t0 + 100, 2_000)
        if gpu_trace:  # on a GPU the mask is one fused kernel, its host op only a launch
            b.launch(t0 + 150, 10, t0 + 200, 1_500)
        b.op("aten::dropout", t0 + 2_200, 1_500)
        b.op("aten::empty_like", t0 + 2_210, 10)
        b.op("aten::bernoulli_", t0 + 2_230, 1_200)
        b.op("aten::div_", t0 + 3_440, 100)
        b.op("aten::mul", t0 + 3_550, 140)
        b.op("aten::feature_dropout", t0 + 4_000, 500)  # another entry point: counted too
        b.op("aten::native_dropout", t0 + 4_010, 480)  # held by it: not counted again
        b.op("aten::bernoulli_", t0 + 4_020, 300)
        b.op("aten::dropout_", t0 + 5_000, 300)  # nn.Dropout(inplace=True)
        b.op("aten::bernoulli", t0 + 5_010, 200)  # a draw holding another: counted once
        b.op("aten::bernoulli_", t0 + 5_020, 190)
        b.op("aten::bernoulli_", t0 + 6_000, 50)  # the user's own random draw, in no dropout
    b.op("aten::dropout", 3 * STEP_US + 100, 900)  # after the steps (an evaluation): not theirs
    return b


def test_dropout_and_its_mask_draws_per_step(tmp_path: Path) -> None:
    rep = torchscope.analyze(_steps().write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.dropout == Dropout(calls_per_step=3.0, dropout_us_per_step=2_300.0, mask_us_per_step=1_700.0)
    f = finding(rep, "compute.dropout")
    assert f.title == "Dropout takes 2.3 ms per step (23.0% of the step), 1.7 ms of it drawing random masks (3 dropout call(s) per step)"


def test_no_dropout_section_on_gpu_traces(tmp_path: Path) -> None:
    rep = torchscope.analyze(_steps(gpu_trace=True).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.dropout == Dropout() and "compute.dropout" not in findings(rep)


def test_dropout_rule() -> None:
    section = Dropout(calls_per_step=12.0, dropout_us_per_step=2_500.0, mask_us_per_step=2_000.0)
    f = finding(report(measurements=Measurements(dropout=section)), "compute.dropout")
    assert (f.severity, f.time_share) == ("info", 0.25)
    assert f.evidence == {"dropout_calls_per_step": 12.0, "dropout_us_per_step": 2_500.0, "mask_us_per_step": 2_000.0}
    assert fixes(f) == {"dropout": ("code_change", "p=0.0")} and "one thread" in f.recommendation
    # A trade against regularisation: a warning at most, however large.
    most = Dropout(calls_per_step=12.0, dropout_us_per_step=9_000.0, mask_us_per_step=8_000.0)
    assert finding(report(measurements=Measurements(dropout=most)), "compute.dropout").severity == "warning"
    small = Dropout(calls_per_step=12.0, dropout_us_per_step=400.0, mask_us_per_step=300.0)
    assert "compute.dropout" not in findings(report(measurements=Measurements(dropout=small)))
    assert "compute.dropout" not in findings(report(measurements=Measurements(dropout=section), device=gpu()))
