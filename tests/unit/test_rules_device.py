"""Device rules on hand-built Reports: idle.device, compute.* (the compute.bound verdict included) and
memory.near_capacity."""

from __future__ import annotations

from typing import Optional

import msgspec
import pytest

from test_rules_support import finding, findings, fixes, gpu, report
from torchscope.diagnose.engine import diagnose
from torchscope.report.measurements import (
    Compile, DataLoader, DeviceIdle, LaunchOverhead, Measurements, Memory, Patterns, ProfilerOverhead, Recompute,
)
from torchscope.report.model import Finding, KernelRow, MemorySummary, OperatorRow

COMPILE_FIX = {"torch.compile": ("code_change", "model = torch.compile(model)")}


def _idle(idle_us: float, explained_us: float, host_ops: Optional[dict[str, float]] = None) -> Measurements:
    return Measurements(
        launch=LaunchOverhead(short_kernel_fraction=0.1),
        idle=DeviceIdle(idle_us_per_step=idle_us, explained_us_per_step=explained_us, host_ops_us_per_step=host_ops or {}),
    )


def test_idle_device_names_the_host_work_in_the_gaps() -> None:
    rep = report(measurements=_idle(7000, 2000, {"aten::nonzero": 4000.0, "aten::cat": 100.0}), device=gpu(utilization=0.3))
    f = finding(rep, "idle.device")
    assert (f.category, f.severity, f.time_share) == ("idle", "critical", 0.5)
    assert f.evidence == {
        "device_idle_share": 0.7,
        "gpu_utilization": 0.3,
        "unexplained_idle_share": 0.5,
        "host_ops_during_idle_us_per_step": {"aten::nonzero": 4000.0, "aten::cat": 100.0},
    }
    assert f.recommendation.startswith("During the gaps the host was busy with: aten::nonzero, aten::cat.")
    assert f.fixes == []


def test_idle_device_thresholds() -> None:
    def idle(utilization: Optional[float], idle_us: float = 7000, explained_us: float = 2000) -> list[str]:
        rep = report(measurements=_idle(idle_us, explained_us), device=gpu(utilization=utilization))
        return [f.recommendation for f in findings(rep).values() if f.id == "idle.device"]

    assert idle(0.49) == ["Raise the batch size or overlap host work with GPU work."]
    assert idle(0.5) == []  # TB / nsys: utilisation from 50 % is not low
    assert idle(None) == []
    assert idle(0.3, idle_us=2000, explained_us=2000) == []  # all idle time belongs to loading or syncs
    small = finding(report(measurements=_idle(2400, 2000), device=gpu(utilization=0.3)), "idle.device")
    assert (small.severity, small.time_share) == ("info", 0.04)


def _tensor_cores(capability: str = "8.0", tc_share: float = 0.0, eligible: float = 0.8) -> list[str]:
    return list(findings(report(device=gpu(compute_capability=capability, tensor_core_kernel_share=tc_share, tensor_core_eligible_share=eligible), breakdown={"kernel": 0.9})))


def test_tensor_cores_unused() -> None:
    device = gpu(compute_capability="8.0", tensor_core_kernel_share=0.0, tensor_core_eligible_share=0.8)
    f = finding(report(device=device, breakdown={"kernel": 0.9}), "compute.tensor_cores_unused")
    assert (f.category, f.severity, f.time_share) == ("compute", "critical", 0.36)  # 0.5 x 0.8 x 0.9
    assert f.evidence == {
        "tensor_core_kernel_share": 0.0,
        "eligible_kernel_share": 0.8,
        "kernel_step_share": 0.9,
        "compute_capability": "8.0",
    }
    assert fixes(f) == {
        "torch.autocast": ("code_change", "torch.autocast('cuda', dtype=torch.bfloat16)"),
        "torch.backends.cuda.matmul.allow_tf32": ("torch_flag", True),
    }


def test_tensor_cores_rule_needs_volta_no_tc_kernel_and_eligible_time() -> None:
    assert "compute.tensor_cores_unused" in _tensor_cores("7.0")
    assert "compute.tensor_cores_unused" not in _tensor_cores("6.1")
    assert "compute.tensor_cores_unused" not in _tensor_cores(tc_share=0.2)
    assert "compute.tensor_cores_unused" not in _tensor_cores(eligible=0.0)


def _kernel(name: str, calls: int, total_us: float) -> KernelRow:
    return KernelRow(name=name, calls=calls, total_us=total_us, mean_us=total_us / calls, min_us=0.0, max_us=0.0)


def test_layout_transposes() -> None:
    kernels = [
        _kernel("void nchwToNhwcKernel<float, float, float, true, false>(int, int)", 8, 1200.0),
        _kernel("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc", 4, 30000.0),
    ]
    f = finding(report(device=gpu(), kernels=kernels), "compute.layout_transposes")
    assert (f.category, f.severity, f.time_share) == ("compute", "info", 0.03)
    assert "(2 transpose kernels per step)" in f.title
    assert f.evidence == {"transpose_us_per_step": 300.0, "kernels": [kernels[0].name]}
    assert fixes(f) == {"channels_last": ("code_change", "model = model.to(memory_format=torch.channels_last)")}
    assert "compute.layout_transposes" not in findings(report(device=gpu(), kernels=kernels[1:]))
    assert "compute.layout_transposes" not in findings(report(kernels=kernels))  # no device


def _cudnn(benchmark: object, conv: bool = True) -> dict[str, Finding]:
    operators = [OperatorRow(name="aten::cudnn_convolution" if conv else "aten::mm", calls=4, host_self_us=10, host_total_us=40)]
    environment = {} if benchmark is None else {"cudnn_benchmark": benchmark}
    return findings(report(device=gpu(), operators=operators, manifest={"environment": environment}))


def test_cudnn_benchmark_off() -> None:
    f = _cudnn(False)["compute.cudnn_benchmark_off"]
    assert (f.category, f.severity, f.time_share) == ("compute", "info", None)
    assert f.evidence == {"cudnn_benchmark": False}
    assert fixes(f) == {"torch.backends.cudnn.benchmark": ("torch_flag", True)}
    assert "compute.cudnn_benchmark_off" not in _cudnn(True)
    assert "compute.cudnn_benchmark_off" not in _cudnn(None)  # not recorded: no verdict
    assert "compute.cudnn_benchmark_off" not in _cudnn(False, conv=False)


def test_low_occupancy() -> None:
    def occupancy(pct: float, kernel_share: float) -> list[str]:
        rep = report(device=gpu(achieved_occupancy_pct=pct, sm_efficiency=0.6), breakdown={"kernel": kernel_share})
        return [f.id for f in findings(rep).values() if f.id == "compute.low_occupancy"]

    f = finding(report(device=gpu(achieved_occupancy_pct=20.0, sm_efficiency=0.6), breakdown={"kernel": 0.8}), "compute.low_occupancy")
    assert (f.category, f.severity, f.time_share) == ("compute", "info", None)
    assert f.evidence == {"achieved_occupancy_pct": 20.0, "sm_efficiency": 0.6}
    assert fixes(f) == COMPILE_FIX
    assert occupancy(30.0, 0.8) == []
    assert occupancy(20.0, 0.5) == []


def test_compute_bound_gpu_verdict() -> None:
    operators = [OperatorRow(name=n, calls=1, host_self_us=1, host_total_us=1) for n in ("aten::mm", "aten::addmm", "aten::relu", "aten::add")]
    f = finding(report(device=gpu(), breakdown={"kernel": 0.8}, operators=operators), "compute.bound")
    assert (f.category, f.severity, f.time_share) == ("compute", "info", None)
    assert f.evidence == {"compute_share": 0.8, "top_operators": ["aten::mm", "aten::addmm", "aten::relu"]}
    assert fixes(f) == {"torch.autocast": ("code_change", "torch.autocast('cuda', dtype=torch.bfloat16)"), **COMPILE_FIX}


def test_compute_bound_cpu_verdict_reads_forward_and_backward() -> None:
    f = finding(report(phases={"forward": 0.3, "backward": 0.4}), "compute.bound")
    assert f.evidence["compute_share"] == 0.7
    assert "forward and backward operators fill 70.0%" in f.title
    assert fixes(f)["torch.autocast"] == ("code_change", "torch.autocast('cpu', dtype=torch.bfloat16)")


def test_compute_bound_leaves_out_what_the_run_already_does() -> None:
    # Matmuls already in bfloat16 (CPU autocast) and compiled regions in the steps: neither is advised again.
    done = Measurements(patterns=Patterns(half_matmuls_per_step=3.0), compile=Compile(compiled_regions_per_step=1.0))
    f = finding(report(measurements=done, phases={"forward": 0.3, "backward": 0.4}), "compute.bound")
    assert f.fixes == [] and "torch.compile" not in f.recommendation and "autocast" not in f.recommendation
    assert f.recommendation.endswith("(Matmuls already run in FP16/BF16; the steps already run compiled code.)")
    half = Measurements(patterns=Patterns(half_matmuls_per_step=3.0))
    f = finding(report(measurements=half, device=gpu(), breakdown={"kernel": 0.8}), "compute.bound")
    assert fixes(f) == COMPILE_FIX and "mixed precision" not in f.recommendation
    # No convolution in the operators: no channels_last, no cudnn.benchmark.
    assert "channels_last" not in f.recommendation and "cudnn" not in f.recommendation
    conv = [OperatorRow(name="aten::convolution", calls=4, host_self_us=10.0, host_total_us=100.0)]
    f = finding(report(measurements=half, device=gpu(), breakdown={"kernel": 0.8}, operators=conv), "compute.bound")
    assert "channels_last for convnets" in f.recommendation and "cudnn.benchmark" in f.recommendation


def test_compute_bound_reads_the_other_findings() -> None:
    loading = Measurements(dataloader=DataLoader(single_process_fetches=4))
    blocked = report(measurements=loading, device=gpu(), breakdown={"kernel": 0.8, "data_loading": 0.1})
    assert "compute.bound" not in findings(blocked)  # a data-loading warning: not bound by compute
    info_only = report(measurements=loading, device=gpu(), breakdown={"kernel": 0.8, "data_loading": 0.01})
    assert "compute.bound" in findings(info_only)
    # Nothing reaches warning: the verdict is the headline, above the 1 % data-loading detail.
    assert [f.id for f in diagnose(info_only)] == ["compute.bound", "data_loading.exposed"]
    # Compute findings themselves do not contradict the verdict.
    tensor_cores = gpu(tensor_core_kernel_share=0.0, tensor_core_eligible_share=0.8)
    assert {"compute.bound", "compute.tensor_cores_unused"} <= set(findings(report(device=tensor_cores, breakdown={"kernel": 0.8})))
    assert "compute.bound" not in findings(report(device=gpu(), breakdown={"kernel": 0.49}))
    assert "compute.bound" not in findings(report(device=gpu(), breakdown={"kernel": 0.8}, steps=0))


def _memory(peak: int, device: str = "cuda:0") -> MemorySummary:
    return MemorySummary(present=True, peak_allocated_bytes={device: peak, "cpu": 100 * 2**30})


def test_memory_near_capacity() -> None:
    total = 10 * 2**30
    f = finding(report(device=gpu(total_memory_bytes=total), memory=_memory(int(0.95 * total))), "memory.near_capacity")
    assert (f.category, f.severity, f.time_share) == ("memory", "warning", None)
    assert f.evidence == {"device": "cuda:0", "peak_allocated_bytes": int(0.95 * total), "total_memory_bytes": total, "ratio": 0.95}
    assert "cuda:0" in f.title
    assert fixes(f) == {
        "PYTORCH_CUDA_ALLOC_CONF": ("env_var", "expandable_segments:True"),
        "torch.utils.checkpoint": ("code_change", "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)"),
    }
    assert "memory.near_capacity" not in findings(report(device=gpu(total_memory_bytes=total), memory=_memory(int(0.89 * total))))
    assert "memory.near_capacity" not in findings(report(device=gpu(total_memory_bytes=None), memory=_memory(total)))


def _threads(threads: int, cpus: int, ranks: int = 1, workers: Optional[int] = None, omp: Optional[str] = None) -> dict:  # type: ignore[type-arg]
    environment = {"torch_num_threads": threads, "cpu_count": 2 * cpus, "physical_cores": cpus, "local_world_size": ranks, "omp_num_threads": omp}
    if workers is not None:
        environment["dataloaders"] = [{"num_workers": workers, "iterations": 5}]
    return {"environment": environment}


def test_compute_threads_below_the_free_cores() -> None:
    # torch.set_num_threads(1) on 2 cores (4 hardware threads), forward+backward 80 % of the step: up to 40 %
    # at perfect scaling.
    f = finding(report(phases={"forward": 0.3, "backward": 0.5}, manifest=_threads(1, 2)), "compute.threads")
    assert (f.category, f.severity) == ("compute", "critical")
    assert (f.time_share_low, f.time_share_high) == (0.2, 0.4)
    assert "torch.set_num_threads(2)" in f.recommendation and "torchrun" not in f.recommendation
    assert fixes(f) == {"torch.set_num_threads": ("torch_flag", 2)}
    # The DataLoader's workers keep their cores: 1 thread, 2 workers on 4 cores leaves 2 for compute.
    f = finding(report(phases={"forward": 0.3, "backward": 0.5}, manifest=_threads(1, 4, workers=2)), "compute.threads")
    assert f.evidence["dataloader_workers"] == 2 and "torch.set_num_threads(2)" in f.recommendation
    # As many threads as free cores, or one rank per core: nothing to say.
    for manifest in (_threads(2, 2), _threads(1, 2, ranks=2), _threads(1, 4, workers=3)):
        assert "compute.threads" not in findings(report(phases={"forward": 0.3, "backward": 0.5}, manifest=manifest))
    # A GPU run, a trace without a manifest, a manifest without the physical cores: not judged.
    assert "compute.threads" not in findings(report(device=gpu(), phases={"forward": 0.8}, manifest=_threads(1, 8)))
    assert "compute.threads" not in findings(report(phases={"forward": 0.8}))
    logical_only = {"environment": {"torch_num_threads": 8, "cpu_count": 16}}  # 8 cores, 2 threads each?
    assert "compute.threads" not in findings(report(phases={"forward": 0.8}, manifest=logical_only))


def test_compute_threads_names_torchruns_default() -> None:
    # torchrun with 2 ranks on 16 cores sets OMP_NUM_THREADS=1: 8 cores per rank are free.
    f = finding(report(phases={"forward": 0.4, "backward": 0.4}, manifest=_threads(1, 16, ranks=2, omp="1")), "compute.threads")
    assert "run it with OMP_NUM_THREADS=8" in f.recommendation
    assert fixes(f) == {"torch.set_num_threads": ("torch_flag", 8), "OMP_NUM_THREADS": ("env_var", "8")}


def test_recompute_between_the_blocks_and_all_recorded() -> None:
    """Low: the recomputed blocks, as forward+backward are slowed; high: blocks and bookkeeping as recorded
    over the unprofiled step."""
    section = Recompute(recomputed_calls_per_step=6, recompute_us_per_step=1000.0, bookkeeping_us_per_step=500.0,
                        modules_us_per_step={"nn.Module: Block_0": 200.0})
    overhead = ProfilerOverhead(method="step_clock", unprofiled_step_us=5000.0, profiled_step_us=10_000.0,
                                corrected_percent={"forward": 40.0, "backward": 40.0, "optimizer": 20.0})
    phases = {"forward": 0.5, "backward": 0.4, "optimizer": 0.1}
    f = finding(report(measurements=Measurements(recompute=section, profiler_overhead=overhead), phases=phases), "compute.recompute")
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.1 * 80 / 90, 1500 / 5000), abs=1e-4)
    assert f.severity == "info" and "recomputes 6 block(s)" in f.title and "1.0 ms of host time" in f.title
    assert [fix.target for fix in f.fixes] == ["torch.utils.checkpoint"]
    small = Recompute(recomputed_calls_per_step=2, recompute_us_per_step=100.0)
    assert "compute.recompute" not in findings(report(measurements=Measurements(recompute=small)))
    # On a GPU: device time, and the room the peak memory leaves.
    gpu_section = msgspec.structs.replace(section, time_base="device")
    memory = Memory(peak_allocated_bytes={"cuda:0": 40 * 2**30})
    f = finding(report(measurements=Measurements(recompute=gpu_section, memory=memory), device=gpu()), "compute.recompute")
    assert "of the GPU's time" in f.title and "50.0% of cuda:0's capacity" in f.recommendation


def _half_report(native: Optional[bool], speed: Optional[float], us: float = 6000.0, gflop: float = 0.3) -> object:
    """A CPU run whose bfloat16 matmuls take `us` of a 10 ms step (`gflop` of math), on a CPU the capture
    found with (`native`) or without oneDNN's bfloat16 kernels and `speed` against float32 (None: not checked)."""
    peak: dict[str, object] = {"matmul_gflops": 150.0, "threads": 2}
    if native is not None:
        peak["bfloat16_native"] = native
    if speed is not None:
        peak["bfloat16_matmul_speed"] = speed
    measurements = Measurements(patterns=Patterns(half_matmuls_per_step=8.0, half_matmul_us_per_step={"bfloat16": us},
                                                  half_matmul_gflop_per_step={"bfloat16": gflop}))
    return report(measurements=measurements, phases={"forward": 0.3, "backward": 0.6, "optimizer": 0.1},
                  manifest={"environment": {"cpu_peak": peak}})


def test_cpu_half_emulated_costs_the_matmuls_at_float32s_speed() -> None:
    # 0.3 GFLOP in 6 ms; in float32 at 100 % of the 150 GFLOP/s measured at capture end 2 ms, at 25 % 8 ms
    # (more than they take now: no saving at the low end)
    f = finding(_half_report(native=False, speed=0.6), "compute.cpu_half_emulated")
    assert f.category == "compute" and f.evidence["float32_us_per_step_estimate"] == {"bfloat16": [2000.0, 6000.0]}
    assert (f.time_share_low, f.time_share_high) == pytest.approx((0.0, 0.4))
    assert "in float32 about 2.0 ms-6.0 ms" in f.title and "Train in float32 on this machine" in f.recommendation
    # 0.03 GFLOP in 6 ms (5 GFLOP/s): float32 takes 0.2-0.8 ms
    f = finding(_half_report(native=False, speed=0.01, gflop=0.03), "compute.cpu_half_emulated")
    assert (f.time_share_low, f.time_share_high) == pytest.approx(((6000 - 800) / 10_000, (6000 - 200) / 10_000))
    assert [fix.target for fix in f.fixes] == ["torch.autocast"]
    # compute.bound, where it is stated, no longer offers bfloat16 on this CPU
    bound = [x for x in diagnose(_half_report(native=False, speed=0.6)) if x.id == "compute.bound"]
    assert all("bfloat16 autocast" not in x.recommendation and "Matmuls already run" not in x.recommendation for x in bound)


def test_cpu_half_emulated_needs_the_capture_check_and_a_slow_dtype() -> None:
    assert "compute.cpu_half_emulated" not in findings(_half_report(native=None, speed=None))  # no check here
    rep = _half_report(native=True, speed=0.9, gflop=0.9)  # 150 GFLOP/s: as fast as float32
    assert "compute.cpu_half_emulated" not in findings(rep)
    # native kernels that still run at a tenth of float32's speed (emulated with AVX512 conversions)
    assert "compute.cpu_half_emulated" in findings(_half_report(native=True, speed=0.1, gflop=0.9))
    assert "compute.cpu_half_emulated" not in findings(_half_report(native=False, speed=0.01, us=300.0))  # 3 % of the step
