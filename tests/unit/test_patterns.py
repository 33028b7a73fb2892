"""The pattern-matcher anti-patterns measured on their own (analysis/patterns.py), on synthetic CPU traces."""

from __future__ import annotations

from pathlib import Path

import torchscope
from helpers.trace_builder import TraceBuilder

STEPS = 3


def _analyze(builder: TraceBuilder, tmp_path: Path) -> torchscope.Report:
    return torchscope.analyze(builder.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)


def test_conv_bias_before_batch_norm(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * 1000.0
        b.step(i, t0, 1000.0)
        b.op("aten::conv2d", t0 + 10, 100, **{"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]})
        b.op("aten::batch_norm", t0 + 120, 50, **{"Input Dims": [[8, 16, 32, 32], [16], [16], [16], [16], [], [], [], []]})
        b.op("aten::conv2d", t0 + 200, 100, **{"Input Dims": [[8, 16, 32, 32], [16, 16, 3, 3], [], [], [], [], []]})  # no bias
        b.op("aten::batch_norm", t0 + 310, 50, **{"Input Dims": [[8, 16, 32, 32], [16], [16], [16], [16], [], [], [], []]})
        b.op("aten::conv2d", t0 + 400, 100, **{"Input Dims": [[8, 16, 32, 32], [16, 16, 3, 3], [16], [], [], [], []]})
        b.op("aten::relu", t0 + 510, 50, **{"Input Dims": [[8, 16, 32, 32]]})  # a bias, but no norm after it
    report = _analyze(b, tmp_path)
    assert report.measurements.patterns.conv_bias_before_batch_norm_per_step == 1
    finding = next(f for f in report.findings if f.id == "compute.conv_bias_before_batch_norm")
    assert finding.fixes[0].value == "torch.nn.Conv2d(..., bias=False)"


def test_half_matmuls_with_dimensions_not_multiples_of_8(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * 1000.0
        b.step(i, t0, 1000.0)
        b.op("aten::mm", t0 + 10, 100, **{"Input Dims": [[64, 100], [100, 64]], "Input type": ["c10::Half", "c10::Half"]})
        b.op("aten::mm", t0 + 200, 100, **{"Input Dims": [[64, 128], [128, 64]], "Input type": ["c10::Half", "c10::Half"]})
        b.op("aten::mm", t0 + 400, 100, **{"Input Dims": [[64, 100], [100, 64]], "Input type": ["float", "float"]})
    report = _analyze(b, tmp_path)
    assert report.measurements.patterns.half_matmuls_misaligned_per_step == 1
    assert any(f.id == "compute.half_matmul_misaligned" for f in report.findings)
