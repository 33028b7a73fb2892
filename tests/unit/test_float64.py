"""Operators computing in float64 (analysis/float64.py, compute.float64): a synthetic GPU trace whose matmuls
take double inputs, with decoys, and the rule on hand-built Reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rules_support import finding, findings, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.float64 import _has_double
from torchscope.report.measurements import Float64, Measurements

STEP_US = 10_000.0


def _trace(double_mm: bool) -> TraceBuilder:
    """4 steps: a matmul (6 ms kernel), double or float; an elementwise op on floats (2 ms kernel); a double
    scalar read back (`aten::item`, no kernel); an op without recorded types (1 ms kernel)."""
    b = TraceBuilder().gpu()
    mm_types = ["double", "double"] if double_mm else ["float", "float"]
    for i in range(4):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.op("aten::mm", t0 + 10, 60, **{"Input type": mm_types, "Input Dims": [[512, 512], [512, 512]]})
        b.launch(t0 + 20, 10, t0 + 100, 6_000, name="volta_dgemm_128x64_nn" if double_mm else "volta_sgemm_128x64_nn")
        b.op("aten::add", t0 + 80, 30, **{"Input type": ["float", "float", "Scalar"]})
        b.launch(t0 + 90, 10, t0 + 6_200, 2_000, name="vectorized_elementwise_kernel")
        b.op("aten::item", t0 + 120, 20, **{"Input type": ["double"], "Input Dims": [[1]]})
        # NumPy's float64 batch made float32 (a conversion, not float64 compute), and a scalar factor.
        b.op("aten::to", t0 + 130, 10, **{"Input type": ["double", "Scalar"], "Input Dims": [[64, 64], []]})
        b.launch(t0 + 132, 5, t0 + 9_400, 100, name="copy_kernel")
        b.op("aten::mul", t0 + 145, 5, **{"Input type": ["float", "double"], "Input Dims": [[64, 64], []]})
        b.launch(t0 + 146, 3, t0 + 9_600, 50, name="mul_kernel")
        b.op("aten::relu", t0 + 150, 20)
        b.launch(t0 + 155, 10, t0 + 8_300, 1_000, name="relu_kernel")
    return b


def test_double_types_are_read_from_the_recorded_lists() -> None:
    assert _has_double('["double", "double"]') and _has_double('["c10::complex<double>"]')
    assert not _has_double('["float", "Scalar"]') and not _has_double('["double-ish"]') and not _has_double("[")
    # A Python number in float32 arithmetic (`x * 0.5`) is a 0-dim double tensor: no float64 compute.
    assert not _has_double('["float", "double"]', "[[64, 64], []]")
    assert _has_double('["double", "double"]', "[[64, 64], []]") and _has_double('["double"]', "[[1]]")


def test_gpu_float64_ops_are_timed_by_their_kernels(tmp_path: Path) -> None:
    rep = torchscope.analyze(_trace(double_mm=True).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.float64
    assert section.time_base == "device"
    assert section.ops_per_step == 2  # the matmul and the double scalar read
    assert section.float64_us_per_step == pytest.approx(6_000)  # the item launched nothing
    assert section.typed_ops_us_per_step == pytest.approx(8_150)  # relu has no recorded types
    assert list(section.by_op) == ["aten::mm"]
    f = next(f for f in rep.findings if f.id == "compute.float64")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.5 * 0.6, 0.95 * 0.6), abs=1e-3)
    assert [fix.target for fix in f.fixes] == ["torch.Tensor.float"]


def test_float_matmuls_are_no_finding(tmp_path: Path) -> None:
    rep = torchscope.analyze(_trace(double_mm=False).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.float64.float64_us_per_step == 0
    assert "compute.float64" not in {f.id for f in rep.findings}


def test_trace_without_recorded_types_measures_nothing(tmp_path: Path) -> None:
    b = TraceBuilder().gpu()
    for i in range(3):
        b.step(i, i * STEP_US, STEP_US)
        b.op("aten::mm", i * STEP_US + 10, 60)
        b.launch(i * STEP_US + 20, 10, i * STEP_US + 100, 6_000)
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.float64 == Float64()


def _report(us: float, default_dtype: str | None = None) -> object:
    section = Float64(time_base="host", ops_per_step=40, float64_us_per_step=us, typed_ops_us_per_step=us,
                      by_op={"aten::addmm": us * 0.7, "aten::mm": us * 0.3})
    manifest = {"environment": {"default_dtype": default_dtype}} if default_dtype else None
    return report(measurements=Measurements(float64=section), manifest=manifest)


def test_rule_threshold_and_the_fix_for_the_default_dtype() -> None:
    step_us = report().steps[0].duration_us
    assert "compute.float64" not in findings(_report(0.04 * step_us))
    f = finding(_report(0.5 * step_us, "torch.float64"), "compute.float64")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.3 * 0.5, 0.6 * 0.5), abs=1e-4)
    assert [fix.target for fix in f.fixes] == ["torch.set_default_dtype"]
    assert "set_default_dtype(torch.float64) is in effect" in f.recommendation
    assert f.evidence["default_dtype"] == "torch.float64"
    f = finding(_report(0.5 * step_us, "torch.float32"), "compute.float64")
    assert [fix.target for fix in f.fixes] == ["torch.Tensor.float"] and "from_numpy" in f.recommendation
