"""FLOPs of matmul-family operators from input shapes, checked against hand computation, and the
roofline figures the compute verdict quotes."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis.flops import op_flops
from torchscope.analysis.peaks import gpu_peak


@pytest.mark.parametrize(
    ("name", "dims", "flops"),
    [
        ("aten::mm", "[[128, 256], [256, 512]]", 2 * 128 * 256 * 512),
        ("aten::matmul", "[[8, 10], [10, 64]]", 2 * 8 * 10 * 64),
        ("aten::addmm", "[[1000],[32,2048],[2048,1000],[],[]]", 2 * 32 * 2048 * 1000),  # ResNet-50's fc layer
        ("aten::bmm", "[[4, 16, 32], [4, 32, 8]]", 2 * 4 * 16 * 32 * 8),
        ("aten::baddbmm", "[[4, 16, 8], [4, 16, 32], [4, 32, 8], [], []]", 2 * 4 * 16 * 32 * 8),
        ("aten::linear", "[[8, 64], [10, 64], [10]]", 2 * 8 * 64 * 10),
        ("aten::linear", "[[4, 7, 64], [10, 64], []]", 2 * 4 * 7 * 64 * 10),  # batch dims multiply
    ],
)
def test_flops_by_hand(name: str, dims: str, flops: int) -> None:
    assert op_flops(name, dims) == flops


@pytest.mark.parametrize(
    ("name", "dims"),
    [("aten::mm", "[[128, 256], [255, 512]]"), ("aten::mm", ""), ("aten::mm", "not json"), ("aten::relu", "[[8, 8]]"),
     # A convolution without its stride and padding ("Concrete Inputs", PyTorch < 2.0): no output size.
     ("aten::convolution", "[[8, 3, 48, 48], [32, 3, 3, 3], [32], [], [], [], [], [], []]")],
)
def test_no_flops_where_the_shapes_do_not_say(name: str, dims: str) -> None:
    assert op_flops(name, dims) is None



# Output size by hand: (in + 2 padding - dilation (k - 1) - 1) // stride + 1 per spatial dimension.
@pytest.mark.parametrize(
    ("name", "dims", "scalars", "flops"),
    [
        # ResNet-50's stem: 224 -> (224 + 6 - 6 - 1) // 2 + 1 = 112
        ("aten::conv2d", "[[8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], []]",
         '["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"]', 2 * 8 * (64 * 3 * 7 * 7) * 112 * 112),
        ("aten::convolution", "[[2, 4, 40], [6, 4, 5], [6], [], [], [], [], [], []]",  # 40 + 6 - 8 - 1 + 1 = 38
         '["", "", "", "[1]", "[3]", "[2]", "False", "[0]", "1"]', 2 * 2 * (6 * 4 * 5) * 38),
        ("aten::_convolution", "[[1, 8, 10, 10], [8, 2, 3, 3], [], [], [], [], [], [], [], [], [], [], []]",  # groups=4
         '["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "4", "False", "False", "True", "True"]',
         2 * 1 * (8 * 2 * 3 * 3) * 10 * 10),
        # Transposed: work per input position (8 x 8 here), whatever the output size.
        ("aten::convolution", "[[2, 8, 8, 8], [8, 4, 3, 3], [4], [], [], [], [], [], []]",
         '["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"]', 2 * 2 * (8 * 4 * 3 * 3) * 8 * 8),
        ("aten::conv2d", "[[1, 3, 9, 9], [4, 3, 3, 3], [], [], [], [], []]",  # one int for both dimensions
         '["", "", "", "2", "0", "1", "1"]', 2 * 1 * (4 * 3 * 3 * 3) * 4 * 4),
    ],
)
def test_convolution_flops_by_hand(name: str, dims: str, scalars: str, flops: int) -> None:
    assert op_flops(name, dims, scalars) == flops


def test_convolution_flops_of_a_real_run_match_torchs_flop_counter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Conv2d(8, 4, (3, 2), dilation=(2, 1)),
                                torch.nn.ConvTranspose2d(4, 2, 3, stride=2))
    x = torch.randn(2, 3, 20, 18)
    with torch.no_grad():
        with FlopCounterMode(display=False) as counter:
            model(x)
        with torch.profiler.profile(record_shapes=True) as prof:
            model(x)
    trace = tmp_path / "conv.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    report = torchscope.analyze(trace, jobs=1, use_cache=False)
    rows = {op.name: op for op in report.operators}
    # Every conv call passes through aten::convolution once: its FLOPs are the model's.
    assert rows["aten::convolution"].flops == counter.get_total_flops()
    assert rows["aten::conv2d"].flops + rows["aten::conv_transpose2d"].flops == counter.get_total_flops()


def test_operator_rows_carry_flops_and_achieved_rate(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        b.step(i, i * 1000.0, 1000.0)
        b.op("aten::mm", i * 1000.0 + 10, 100, **{"Input Dims": [[128, 256], [256, 512]]})
        b.op("aten::relu", i * 1000.0 + 200, 50, **{"Input Dims": [[128, 512]]})
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    rows = {op.name: op for op in report.operators}
    assert rows["aten::mm"].flops == 3 * 2 * 128 * 256 * 512
    assert rows["aten::mm"].achieved_flops_per_s == pytest.approx(2 * 128 * 256 * 512 / 100e-6)
    assert rows["aten::relu"].flops is None and rows["aten::relu"].achieved_flops_per_s is None


def test_gpu_peaks_by_reported_name() -> None:
    v100 = gpu_peak("Tesla V100-DGXS-32GB")
    assert v100 is not None and v100.fp32_tflops == 15.7
    a100 = gpu_peak("NVIDIA A100-SXM4-80GB")
    assert a100 is not None and a100.fp32_tflops == 19.5
    pcie = gpu_peak("NVIDIA H100 PCIe")
    assert pcie is not None and pcie.fp32_tflops == 51.2
    assert gpu_peak("Some Future GPU") is None


def test_compute_verdict_quotes_the_matmul_rate_against_the_gpu_peak() -> None:
    from test_rules_support import finding, gpu, report
    from torchscope.report.model import OperatorRow

    # 4 steps of 10 ms at 80 % kernels: 32 ms of compute; the mm rows take 16 ms of device time.
    mm = OperatorRow(name="aten::mm", calls=40, host_self_us=400, host_total_us=800, device_self_us=16_000,
                     device_total_us=16_000, flops=40 * 2 * 4096**3)
    f = finding(report(device=gpu(name="Tesla V100-SXM2-16GB"), breakdown={"kernel": 0.8}, operators=[mm]), "compute.bound")
    gflops = 40 * 2 * 4096**3 / 16e-3 / 1e9  # 343,597 GFLOP/s: more than a V100 can do, but a hand figure
    assert f.evidence["matmul_gflops"] == pytest.approx(gflops, rel=1e-3)
    assert f.evidence["peak_fp32_gflops"] == 15_700
    assert f.evidence["matmul_share_of_fp32_peak"] == pytest.approx(gflops / 15_700, rel=1e-3)
    small = OperatorRow(name="aten::mm", calls=1, host_self_us=1, host_total_us=2, device_total_us=100, flops=1e6)
    assert "matmul_gflops" not in finding(report(device=gpu(), breakdown={"kernel": 0.8}, operators=[small]), "compute.bound").evidence


def test_cpu_verdict_quotes_the_matmul_rate_against_the_rate_measured_at_capture() -> None:
    from test_rules_support import finding, report
    from torchscope.report.model import OperatorRow

    # aten::linear nests aten::addmm: the same FLOPs twice; only addmm counts (ROOFLINE_OPS).
    linear = OperatorRow(name="aten::linear", calls=40, host_self_us=100, host_total_us=20_100, flops=40 * 2 * 512**3)
    addmm = OperatorRow(name="aten::addmm", calls=40, host_self_us=20_000, host_total_us=20_000, flops=40 * 2 * 512**3)
    manifest = {"environment": {"cpu_peak": {"matmul_gflops": 1000.0, "copy_gbps": 10.0, "threads": 2}}}
    rep = report(phases={"forward": 0.5, "backward": 0.3}, operators=[linear, addmm], manifest=manifest)
    f = finding(rep, "compute.bound")
    gflops = 40 * 2 * 512**3 / 20e-3 / 1e9  # 536.9 GFLOP/s
    assert f.evidence["matmul_gflops"] == pytest.approx(gflops, rel=1e-3)
    assert f.evidence["peak_fp32_gflops"] == 1000.0
    assert f.evidence["matmul_share_of_fp32_peak"] == pytest.approx(gflops / 1000.0, rel=1e-3)
    assert "(53.7% of this CPU's FP32 matmul rate on 2 thread(s) measured at capture)" in f.title
    assert f.evidence["peak_threads"] == 2.0
    # The run's matmuls faster than the check at capture end (it ran at a busier moment): no share of a peak
    # (a loaded VM's compute.bound read "148.3% of this CPU's FP32 matmul rate").
    manifest["environment"]["cpu_peak"]["matmul_gflops"] = 100.0
    slow_check = finding(report(phases={"forward": 0.5, "backward": 0.3}, operators=[linear, addmm], manifest=manifest), "compute.bound")
    assert slow_check.evidence["matmul_share_of_fp32_peak"] is None and slow_check.evidence["peak_fp32_gflops"] == 100.0
    assert "536.9 GFLOP/s, above the 100.0 GFLOP/s this CPU's FP32 matmul on 2 thread(s) reached at capture end" in slow_check.title
    assert "% of this CPU" not in slow_check.title
    # With bfloat16 matmuls among them (a CPU with AMX beats its float32 rate) the share stands.
    from torchscope.report.measurements import Measurements, Patterns

    half = report(phases={"forward": 0.5, "backward": 0.3}, operators=[linear, addmm], manifest=manifest,
                  measurements=Measurements(patterns=Patterns(half_matmuls_per_step=40.0)))
    assert finding(half, "compute.bound").evidence["matmul_share_of_fp32_peak"] == pytest.approx(gflops / 100.0, rel=1e-3)
    unmeasured = finding(report(phases={"forward": 0.5, "backward": 0.3}, operators=[linear, addmm]), "compute.bound")
    assert unmeasured.evidence["peak_fp32_gflops"] is None and unmeasured.evidence["matmul_share_of_fp32_peak"] is None
