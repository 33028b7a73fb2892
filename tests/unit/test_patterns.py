"""The pattern-matcher anti-patterns measured on their own (analysis/patterns.py), on synthetic CPU traces."""

from __future__ import annotations

from pathlib import Path

import pytest

import msgspec

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


@pytest.mark.parametrize("on_gpu", [True, False])
def test_half_matmuls_with_dimensions_not_multiples_of_8(tmp_path: Path, on_gpu: bool) -> None:
    b = TraceBuilder().gpu() if on_gpu else TraceBuilder()
    for i in range(STEPS):
        t0 = i * 1000.0
        b.step(i, t0, 1000.0)
        b.op("aten::mm", t0 + 10, 100, **{"Input Dims": [[64, 100], [100, 64]], "Input type": ["c10::Half", "c10::Half"]})
        b.op("aten::mm", t0 + 200, 100, **{"Input Dims": [[64, 128], [128, 64]], "Input type": ["c10::Half", "c10::Half"]})
        b.op("aten::mm", t0 + 400, 100, **{"Input Dims": [[64, 100], [100, 64]], "Input type": ["float", "float"]})
        if on_gpu:
            b.launch(t0 + 20, 5, t0 + 30, 60)
    report = _analyze(b, tmp_path)
    assert report.measurements.patterns.half_matmuls_misaligned_per_step == 1
    assert report.measurements.patterns.half_matmuls_per_step == 2
    # Tensor cores are a GPU's: on a CPU trace (autocast to bfloat16 there) the finding would not apply.
    assert any(f.id == "compute.half_matmul_misaligned" for f in report.findings) == on_gpu


def _indexing_loop(b: TraceBuilder, t0: float, iterations: int, body: tuple[str, ...] = ("aten::select", "aten::fill_")) -> float:
    """`for i in range(iterations): t[i] = i` as sibling ops of 10 us each; returns the end time."""
    t = t0
    for _ in range(iterations):
        for name in body:
            b.op(name, t, 10)
            t += 12
    return t


def test_an_indexing_loop_is_found_with_its_iterations_and_time(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000.0)
        end = _indexing_loop(b, t0 + 10, 25)
        b.op("aten::mm", end + 5, 100)  # after the loop: the last iteration runs on into it
        _indexing_loop(b, end + 200, 9)  # too short to be a loop (the matcher asks for 10)
        _indexing_loop(b, end + 800, 12, ("aten::select", "aten::add", "aten::select", "aten::mul"))  # a period of 2 selects
    patterns = _analyze(b, tmp_path).measurements.patterns
    # 25 iterations of 2 ops, 10 us each; the 12 two-select iterations are 24 select-led segments of 2 alternating kinds.
    assert patterns.indexing_loop_iterations_per_step == 25
    assert patterns.indexing_loop_us_per_step == 25 * 2 * 10


def test_a_tensor_filled_on_the_cpu_then_copied_to_the_device(tmp_path: Path) -> None:
    b = TraceBuilder().gpu()
    for i in range(STEPS):
        t0 = i * 1000.0
        b.step(i, t0, 1000.0)
        # torch.zeros(n).to("cuda"): the fill, then to -> _to_copy -> copy_ (one dtype) with its H2D copy
        b.op("aten::zeros", t0 + 10, 30)
        b.op("aten::zero_", t0 + 15, 20)
        b.op("aten::fill_", t0 + 16, 18)
        b.op("aten::to", t0 + 50, 40)
        b.op("aten::_to_copy", t0 + 51, 38)
        b.op("aten::copy_", t0 + 52, 36, **{"Input type": ["float", "float", "Scalar"]})
        b.launch(t0 + 55, 20, t0 + 80, 15, name="Memcpy HtoD (Pageable -> Device)", runtime="cudaMemcpyAsync", cat="gpu_memcpy")
        # A dtype conversion after a fill is not this pattern, nor is a copy after other work.
        b.op("aten::fill_", t0 + 100, 10)
        b.op("aten::to", t0 + 120, 40)
        b.op("aten::_to_copy", t0 + 121, 38)
        b.op("aten::copy_", t0 + 122, 36, **{"Input type": ["c10::Half", "float", "Scalar"]})
        b.op("aten::cat", t0 + 170, 10)
        b.op("aten::to", t0 + 190, 40)
        b.op("aten::_to_copy", t0 + 191, 38)
        b.op("aten::copy_", t0 + 192, 36, **{"Input type": ["float", "float", "Scalar"]})
    report = _analyze(b, tmp_path)
    assert report.measurements.patterns.extra_device_copies_per_step == 1
    assert report.measurements.patterns.extra_device_copy_us_per_step == 40
    finding = next(f for f in report.findings if f.id == "host_overhead.extra_device_copy")
    assert finding.fixes[0].value == "torch.zeros(..., device='cuda')"


def test_a_same_dtype_copy_on_a_cpu_only_run_is_no_device_copy(tmp_path: Path) -> None:
    # `torch.zeros(n).to(device)` with device = "cpu" and a copy (a Trainer moving its inputs): the matcher's
    # shape, but there is no device to create the tensor on.
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * 1000.0
        b.step(i, t0, 1000.0)
        b.op("aten::fill_", t0 + 16, 18)
        b.op("aten::to", t0 + 50, 40)
        b.op("aten::_to_copy", t0 + 51, 38)
        b.op("aten::copy_", t0 + 52, 36, **{"Input type": ["float", "float", "Scalar"]})
    report = _analyze(b, tmp_path)
    assert report.measurements.patterns.extra_device_copies_per_step == 1
    assert "host_overhead.extra_device_copy" not in {f.id for f in report.findings}
    # A GPU run recorded without device activity (activities=CPU) names its accelerator in the manifest.
    from test_rules_support import findings as diagnosed

    gpu_run = msgspec.structs.replace(report, run=msgspec.structs.replace(report.run, manifest={"environment": {"accelerator": "cuda"}}))
    assert "host_overhead.extra_device_copy" in diagnosed(gpu_run)
