"""The CPU's matmul and copy rates measured at the end of a CPU capture (capture/cpu_peak.py): recorded in
the manifest, outside the trace, and what the compute verdict compares the run's matmuls with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torchscope

torch = pytest.importorskip("torch")


def test_a_completed_cpu_capture_records_the_cpus_peak_outside_the_trace(tmp_path: Path) -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with torchscope.profile(out=tmp_path / "run") as prof:
        for _ in range(6):
            torch.mm(a, b)
            prof.step()
    [manifest_path] = (tmp_path / "run").glob("run*.json")
    environment = json.loads(manifest_path.read_text())["environment"]
    peak = environment["cpu_peak"]
    # A 2-core VM does a few to hundreds of GFLOP/s and GB/s; zero or absurd figures mean a broken timer.
    assert 0.5 < peak["matmul_gflops"] < 1e5 and 0.1 < peak["copy_gbps"] < 1e4
    assert peak["threads"] == torch.get_num_threads()
    # whether oneDNN has half-precision kernels here, as torch itself decides, and their speed against float32
    assert peak["bfloat16_native"] is torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert peak["float16_native"] is torch.ops.mkldnn._is_mkldnn_fp16_supported()
    assert 0 < peak["bfloat16_matmul_speed"] < 100 and 0 < peak["float16_matmul_speed"] < 100
    [trace] = (tmp_path / "run").glob("*.pt.trace.json")
    shapes = [e.get("args", {}).get("Input Dims") for e in json.loads(trace.read_text())["traceEvents"]]
    assert [[512, 512], [512, 512]] not in [s[:2] if isinstance(s, list) else None for s in shapes]  # not profiled
    report = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False)
    assert report.run.manifest["environment"]["cpu_peak"]["matmul_gflops"] == peak["matmul_gflops"]


def test_a_bfloat16_autocast_run_on_the_cpu_measures_its_half_matmuls(tmp_path: Path) -> None:
    """The matmul kernels' time and FLOPs by the dtype they compute in (autocast's outer aten::linear still
    shows float32 inputs), and compute.cpu_half_emulated where this CPU has no fast bfloat16 kernels."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    with torchscope.profile(out=tmp_path / "run", wait=0, warmup=1, active=3) as prof:
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    report = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False)
    patterns = report.measurements.patterns
    assert set(patterns.half_matmul_us_per_step) == {"bfloat16"} and patterns.half_matmul_us_per_step["bfloat16"] > 0
    # per step: forward 64x256x256 and 64x256x8, backward their input and weight gradients (the first layer's
    # input gradient is not needed): 2 * (3 * 64*256*256 - 64*256*256 + 3 * 64*256*8) FLOPs
    expected = 2 * (2 * 64 * 256 * 256 + 3 * 64 * 256 * 8) / 1e9
    assert patterns.half_matmul_gflop_per_step["bfloat16"] == pytest.approx(expected, rel=0.01)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # ATen's scalar fallback: most of the step
        [finding] = [f for f in report.findings if f.id == "compute.cpu_half_emulated"]
        assert finding.evidence["bfloat16_native"] is False and finding.time_share > 0
        compute = [f for f in report.findings if f.id == "compute.bound"]
        assert all("bfloat16 autocast" not in f.recommendation for f in compute)


def test_sdpas_cpu_attention_kernels_in_bfloat16_count_with_the_half_matmuls(tmp_path: Path) -> None:
    """SDPA's CPU flash-attention kernels run their matmuls in ATen's CPU gemm too: in bfloat16 on a CPU
    without its kernels, 112 ms against 25 ms in float32 for one forward and backward (B=4, H=8, L=256,
    E=64). Their time and FLOPs (4 B H L S E forward, 2.5x that backward) join the half matmuls'."""
    B, H, L, S, E = 2, 4, 64, 128, 32  # keys longer than queries: the backward's inputs start with grad_out
    q = torch.randn(B, H, L, E, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, H, S, E, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with torchscope.profile(out=tmp_path / "run", wait=0, warmup=1, active=3) as prof:
        for _ in range(4):
            torch.nn.functional.scaled_dot_product_attention(q, k, v).float().sum().backward()
            prof.step()
    patterns = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False).measurements.patterns
    assert patterns.half_matmul_us_per_step["bfloat16"] > 0
    assert patterns.half_matmul_gflop_per_step["bfloat16"] == pytest.approx((4 + 10) * B * H * L * S * E / 1e9, rel=0.01)
