"""Device rules: idle gaps, compute (tensor cores, occupancy) and memory."""

from __future__ import annotations

from torchscope.diagnose.context import Context, finding, pct, severity_for
from torchscope.diagnose.rules_host import idle_share, is_launch_bound, unexplained_idle_share
from torchscope.report.model import Finding

# TensorBoard plugin / nsys: GPU utilisation under 50 % is low.
LOW_UTILIZATION = 0.5


def idle(ctx: Context) -> list[Finding]:
    utilization = ctx.report.device.utilization
    if not ctx.report.device.present or utilization is None or is_launch_bound(ctx):
        return []
    idle = idle_share(ctx)
    share = unexplained_idle_share(ctx)
    if share <= 0 or utilization >= LOW_UTILIZATION:
        return []
    host_ops = dict(list(ctx.report.signals.get("idle_host_ops", {}).items())[:5])
    return [
        finding(
            id="idle.device",
            category="idle",
            severity=severity_for(share),
            title=f"GPU idle {pct(idle)} of the step (kernel utilisation {pct(utilization)}); "
            f"{pct(share)} while the host was neither loading data nor waiting in a sync",
            evidence={
                "device_idle_share": idle,
                "gpu_utilization": utilization,
                "unexplained_idle_share": share,
                "host_ops_during_idle_us_per_step": host_ops,
            },
            time_share=share,
            recommendation=(
                "During the gaps the host was busy with: " + ", ".join(host_ops) + ". Shorten that host work, overlap "
                "it with GPU work, or raise the batch size so each step gives the GPU more to do."
                if host_ops
                else "Raise the batch size or overlap host work with GPU work."
            ),
        )
    ]


AMP_RECOVERABLE = 0.5  # assume AMP/TF32 halves the eligible FP32 kernel time (V100/A100 GEMMs gain 2-8x)


def compute(ctx: Context) -> list[Finding]:
    findings = []
    device = ctx.report.device
    major = int(device.compute_capability.split(".")[0]) if device.compute_capability else 0
    eligible = device.tensor_core_eligible_share
    if device.present and major >= 7 and device.tensor_core_kernel_share == 0 and eligible:
        kernel_share = ctx.breakdown_share("kernel")
        share = AMP_RECOVERABLE * eligible * kernel_share
        findings.append(
            finding(
                id="compute.tensor_cores_unused",
                category="compute",
                severity=severity_for(share),
                title=f"No kernel uses tensor cores, yet {pct(eligible)} of kernel time comes from "
                "tensor-core-eligible ops (GEMM/convolution)",
                evidence={
                    "tensor_core_kernel_share": device.tensor_core_kernel_share,
                    "eligible_kernel_share": eligible,
                    "kernel_step_share": kernel_share,
                    "compute_capability": device.compute_capability,
                    "estimated_saving_share": share,
                },
                time_share=share,
                recommendation=(
                    "Run matmuls/convolutions in reduced precision: torch.autocast('cuda', dtype=torch.bfloat16) "
                    "(or float16 with GradScaler on pre-Ampere GPUs), and torch.backends.cuda.matmul.allow_tf32 = True / "
                    "torch.set_float32_matmul_precision('high') for the remaining FP32 work."
                ),
            )
        )
    findings += _layout_and_autotune(ctx)
    occupancy = device.achieved_occupancy_pct
    if device.present and occupancy is not None and occupancy < 30 and ctx.breakdown_share("kernel") > 0.5:
        findings.append(
            finding(
                id="compute.low_occupancy",
                category="compute",
                severity="info",
                title=f"Kernels reach a low estimated occupancy ({occupancy:.0f}%)",
                evidence={"achieved_occupancy_pct": occupancy, "sm_efficiency": device.sm_efficiency},
                time_share=None,
                recommendation="Small kernels leave SMs idle: raise the batch size (multiples of 8), fuse kernels "
                "(torch.compile), use channels_last for convolutions.",
            )
        )
    return findings


_LAYOUT_KERNELS = ("nchwToNhwc", "nhwcToNchw", "nchw_to_nhwc", "nhwc_to_nchw")


def _layout_and_autotune(ctx: Context) -> list[Finding]:
    """Convolution hygiene on GPU: layout transposes around convolutions (channels_last missing) and
    cudnn.benchmark off (recorded in the capture manifest)."""
    if not ctx.report.device.present:
        return []
    out = []
    transposes = [k for k in ctx.report.kernels if any(p in k.name for p in _LAYOUT_KERNELS)]
    steps = max(ctx.steps, 1)
    if transposes:
        us = sum(k.total_us for k in transposes) / steps
        out.append(
            finding(
                id="compute.layout_transposes",
                category="compute",
                severity="info",
                title=f"Convolutions convert memory layouts ({sum(k.calls for k in transposes) / steps:.0f} transpose kernels per step)",
                evidence={"transpose_us_per_step": us, "kernels": [k.name for k in transposes[:3]]},
                time_share=ctx.share(us),
                recommendation="Keep activations in channels_last: model.to(memory_format=torch.channels_last) and "
                "inputs .to(memory_format=torch.channels_last), so cuDNN's NHWC tensor-core kernels need no transposes.",
            )
        )
    environment = ctx.report.run.manifest.get("environment") or {}
    has_conv = any("convolution" in op.name for op in ctx.report.operators)
    if has_conv and environment.get("cudnn_benchmark") is False:
        out.append(
            finding(
                id="compute.cudnn_benchmark_off",
                category="compute",
                severity="info",
                title="cudnn.benchmark is off in a convolutional model",
                evidence={"cudnn_benchmark": False},
                time_share=None,
                recommendation="With fixed input shapes set torch.backends.cudnn.benchmark = True so cuDNN picks the "
                "fastest convolution algorithm once (keep it off when shapes change every step).",
            )
        )
    return out


COMPUTE_BOUND_SHARE = 0.5  # (I) below this, "compute-bound" would hide an unexplained half of the step


def compute_verdict(ctx: Context, others: list[Finding]) -> list[Finding]:
    """Stated when no other category reaches warning level: the run is bound by its own compute."""
    if any(f.severity != "info" and f.category not in ("compute", "trace_quality") for f in others):
        return []
    if ctx.steps == 0:
        return []
    share = ctx.breakdown_share("kernel") if ctx.has_device else ctx.phase_share("forward") + ctx.phase_share("backward")
    if share < COMPUTE_BOUND_SHARE:
        return []
    where = (
        f"GPU kernels fill {pct(share)} of the step"
        if ctx.has_device
        else f"forward and backward operators fill {pct(share)} of the step"
    )
    top = [op.name for op in ctx.report.operators[:3]]
    return [
        finding(
            id="compute.bound",
            category="compute",
            severity="info",
            title=f"Compute-bound: {where}; no input, host or synchronisation bottleneck found",
            evidence={"compute_share": share, "top_operators": top},
            time_share=None,  # a verdict, not a cost: nothing here can be removed
            recommendation=(
                "Speed comes from doing the math faster: mixed precision (torch.autocast), torch.compile, "
                "channels_last for convnets, cudnn.benchmark=True for fixed shapes, or a larger batch per step."
                if ctx.has_device
                else "Speed comes from doing the math faster: torch.compile, bfloat16 autocast on CPUs that support it, "
                "channels_last for convnets, or more threads (torch.set_num_threads) if cores are idle."
            ),
        )
    ]


MEMORY_NEAR_CAPACITY = 0.9  # TensorBoard plugin (data.py)


def memory(ctx: Context) -> list[Finding]:
    total = ctx.report.device.total_memory_bytes
    peaks = {k: v for k, v in ctx.report.memory.peak_allocated_bytes.items() if k.startswith(("cuda", "device"))}
    if not total or not peaks:
        return []
    device, peak = max(peaks.items(), key=lambda kv: kv[1])
    ratio = peak / total
    if ratio < MEMORY_NEAR_CAPACITY:
        return []
    return [
        finding(
            id="memory.near_capacity",
            category="memory",
            severity="warning",
            title=f"Peak allocated memory on {device} is {pct(ratio)} of the GPU's capacity",
            evidence={"peak_allocated_bytes": peak, "total_memory_bytes": total, "ratio": ratio},
            time_share=None,
            recommendation="Close to out-of-memory (and allocator retries): use activation checkpointing, mixed precision, "
            "a smaller micro-batch with gradient accumulation, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        )
    ]
