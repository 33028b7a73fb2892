"""Host-side rules: dispatch/launch overhead, optimizer implementation, work outside the phases,
host-device synchronisation."""

from __future__ import annotations

from torchscope.diagnose.context import Context, finding, ms, pct, severity_for
from torchscope.diagnose.rules_input import COPY_OPS
from torchscope.report.model import Finding

# TraceLens: a gap whose op self-time covers < 20 % is "CPU untraced" (Python); HTA: launches 5-20 us.
TINY_OPS_PER_STEP = 200
HOST_OVERHEAD_SHARE = 0.10
LAUNCH_BOUND_SHORT_FRACTION = 0.5
LAUNCH_BOUND_UTILIZATION = 0.7


def host_overhead(ctx: Context) -> list[Finding]:
    return _launch_bound(ctx) if ctx.has_device else _dispatch_bound(ctx)


def _dispatch_bound(ctx: Context) -> list[Finding]:
    tiny_ops = ctx.signal("dispatch", "tiny_ops_per_step")
    tiny_us = ctx.signal("dispatch", "tiny_op_us_per_step")
    gap_us = ctx.signal("dispatch", "python_gap_us_per_step")
    evidence = {
        "tiny_ops_per_step": tiny_ops,
        "tiny_op_us_per_step": tiny_us,
        "python_gap_us_per_step": gap_us,
        "ops_in_forward_backward_per_step": ctx.signal("dispatch", "ops_per_step"),
        "median_op_us": ctx.signal("dispatch", "median_op_us"),
    }
    if tiny_ops >= TINY_OPS_PER_STEP:
        share = ctx.share(tiny_us + gap_us)
        return [
            finding(
                id="host_overhead.dispatch",
                category="host_overhead",
                severity=severity_for(share, HOST_OVERHEAD_SHARE),
                title=f"Forward/backward spend {pct(share)} of the step on tiny ops and Python between them "
                f"({tiny_ops:.0f} ops under 30 us per step)",
                evidence={**evidence, "step_share": share},
                time_share=share,
                recommendation=(
                    "The model runs many small operations from Python (e.g. a per-sample or per-element loop). "
                    "Vectorise it into batched tensor ops, use torch.compile(model) to fuse the small ops, or raise "
                    "the batch size so each op does more work."
                ),
            )
        ]
    share = ctx.share(gap_us)
    if share < HOST_OVERHEAD_SHARE:
        return []
    environment = ctx.report.run.manifest.get("environment") or {}
    cpus = environment.get("cpu_count")
    multi = ctx.signal("dataloader", "multi_process_fetches") > 0
    contention = (
        f" On this machine {cpus} CPU(s) are shared by the training process and its DataLoader workers, so "
        "the training thread may also have been waiting for a core."
        if multi and isinstance(cpus, int) and cpus <= 4
        else ""
    )
    return [
        finding(
            id="host_overhead.python",
            category="host_overhead",
            severity=severity_for(share, HOST_OVERHEAD_SHARE),
            title=f"{pct(share)} of the step runs Python inside forward/backward outside any PyTorch operator",
            evidence={**evidence, "step_share": share, "cpu_count": cpus},
            time_share=share,
            recommendation=(
                "Python code runs between the operators of the forward/backward pass (control flow, data "
                "munging, hooks). Look at the Python frames in the timeline for those gaps, move that work out of "
                "the model or into tensor ops, or let torch.compile trace it." + contention
            ),
        )
    ]


def _launch_bound(ctx: Context) -> list[Finding]:
    short = ctx.signal("launch", "short_kernel_fraction")
    utilization = ctx.report.device.utilization
    if not is_launch_bound(ctx):
        return []
    share = unexplained_idle_share(ctx)
    if share <= 0:
        return []
    return [
        finding(
            id="host_overhead.launch_bound",
            category="host_overhead",
            severity=severity_for(share),
            title=f"GPU waits on the host: {pct(short)} of kernels are shorter than their launch, "
            f"{pct(share)} of the step idle",
            evidence={
                "short_kernel_fraction": short,
                "kernels_per_step": ctx.signal("launch", "kernels_per_step"),
                "median_kernel_us": ctx.signal("launch", "median_kernel_us"),
                "median_launch_us": ctx.signal("launch", "median_launch_us"),
                "gpu_utilization": utilization,
                "device_idle_share": idle_share(ctx),
                "unexplained_idle_share": share,
                "host_ops_during_idle_us_per_step": dict(list(ctx.report.signals.get("idle_host_ops", {}).items())[:5]),
            },
            time_share=share,
            recommendation=(
                "Kernels are too small to hide the CPU launch cost. Fuse them with torch.compile(model), capture "
                "the step in CUDA graphs (torch.compile(mode='reduce-overhead')), use foreach/fused optimizers, "
                "or raise the batch size."
            ),
        )
    ]


def idle_share(ctx: Context) -> float:
    """Share of the step with no kernel, copy or memset running on the device."""
    return ctx.share(float(ctx.report.signals.get("idle_us_per_step", 0.0)))


def unexplained_idle_share(ctx: Context) -> float:
    """Device idle share of the step during which the host was neither loading data nor blocked in a
    sync (those gaps belong to the data-loading and synchronisation findings)."""
    idle = float(ctx.report.signals.get("idle_us_per_step", 0.0))
    explained = float(ctx.report.signals.get("idle_explained_us_per_step", 0.0))
    return ctx.share(max(idle - explained, 0.0))


def is_launch_bound(ctx: Context) -> bool:
    """Most kernels are shorter than their launch and the GPU is not kept busy (HTA "short kernels")."""
    utilization = ctx.report.device.utilization
    return (
        ctx.signal("launch", "short_kernel_fraction") >= LAUNCH_BOUND_SHORT_FRACTION
        and utilization is not None
        and utilization < LAUNCH_BOUND_UTILIZATION
    )


OPTIMIZER_SHARE = 0.10
PER_PARAM_OPS = 50


def optimizer(ctx: Context) -> list[Finding]:
    share = ctx.phase_share("optimizer")
    implementation = ctx.signal("optimizer", "implementation", "unknown")
    per_param = ctx.signal("optimizer", "per_param_ops_per_step")
    fills = ctx.signal("optimizer", "zero_grad_fill_ops_per_step")
    names = ctx.signal("optimizer", "optimizers", [])
    findings = []
    if share >= OPTIMIZER_SHARE or (implementation == "for_loop" and per_param >= PER_PARAM_OPS):
        loop = implementation == "for_loop"
        findings.append(
            finding(
                id="optimizer.step",
                category="optimizer",
                severity=severity_for(share, OPTIMIZER_SHARE),
                title=f"Optimizer step takes {pct(share)} of the step"
                + (f" with a per-parameter loop ({per_param:.0f} small ops per step)" if loop else ""),
                evidence={
                    "optimizer_us_per_step": share * ctx.mean_step_us,
                    "step_share": share,
                    "optimizers": names,
                    "implementation": implementation,
                    "per_param_ops_per_step": per_param,
                    "foreach_ops_per_step": ctx.signal("optimizer", "foreach_ops_per_step"),
                    "fused_ops_per_step": ctx.signal("optimizer", "fused_ops_per_step"),
                },
                time_share=share,
                recommendation=(
                    "Use the multi-tensor implementation: torch.optim." + (names[0] if names else "Adam")
                    + "(..., foreach=True), or fused=True (CUDA; CPU for Adam/AdamW/SGD in recent PyTorch), "
                    "which updates all parameters in a few kernels instead of one op per parameter per update term."
                    if loop
                    else "The optimizer itself is a large share of the step: try fused=True, a cheaper optimizer, "
                    "fewer parameter groups, or (distributed) ZeroRedundancyOptimizer / FSDP to shard the work."
                ),
            )
        )
    if fills > 0:
        zero_us = ctx.signal("optimizer", "zero_grad_us_per_step")
        findings.append(
            finding(
                id="optimizer.zero_grad_fill",
                category="optimizer",
                severity="info",
                title=f"zero_grad fills gradients with zeros ({fills:.0f} fill ops per step, {ms(zero_us)})",
                evidence={"zero_fill_ops_per_step": fills, "zero_grad_us_per_step": zero_us},
                time_share=ctx.share(zero_us),
                recommendation="Call optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0): it frees "
                "gradients instead of writing zeros, saving memory traffic.",
            )
        )
    return findings


OUTSIDE_SHARE = 0.05
_CULPRIT_HINTS = (
    (("save", "checkpoint", "pickle", "serialization", "torch.save"), "write checkpoints every N steps (or from a background thread / torch.distributed.checkpoint async_save)"),
    (("item", "_local_scalar_dense", "tolist", "print", "log", "metric"), "log metrics every N steps and avoid .item()/.cpu() on each step"),
    (("eval", "valid"), "run evaluation every N steps, not inside every step"),
)


def outside_steps(ctx: Context) -> list[Finding]:
    culprits: dict[str, float] = ctx.report.signals.get("outside_steps", {}) or {}
    other_us = ctx.phase_share("other") * ctx.mean_step_us
    explained_us = min(sum(culprits.values()), other_us)
    share = ctx.share(explained_us)  # only what the named culprits account for
    if share < OUTSIDE_SHARE or not culprits:
        return []
    top = dict(list(culprits.items())[:5])
    hints = [hint for words, hint in _CULPRIT_HINTS if any(w in " ".join(top).lower() for w in words)]
    return [
        finding(
            id="outside_steps.work",
            category="outside_steps",
            severity=severity_for(share),
            title=f"{pct(share)} of each step runs outside data loading/forward/backward/optimizer, mostly in "
            + ", ".join(list(top)[:2]),
            evidence={
                "outside_us_per_step": explained_us,
                "step_share": share,
                "unattributed_other_us_per_step": max(other_us - explained_us, 0.0),
                "culprits_us_per_step": top,
            },
            time_share=share,
            recommendation=(
                "Move this work out of the per-step path: " + ("; ".join(hints) if hints else
                "run it every N steps or in a background thread") + "."
            ),
        )
    ]


SYNC_SHARE = 0.03


def synchronization(ctx: Context) -> list[Finding]:
    count = ctx.signal("sync", "syncs_per_step")
    if count <= 0 or not ctx.has_device:
        return []
    # Syncs issued by copy ops are the h2d_copy.blocking finding: count them once.
    by_op = {op: us for op, us in (ctx.signal("sync", "by_op", {}) or {}).items() if op not in COPY_OPS}
    if not by_op:
        return []
    us = sum(by_op.values())
    share = ctx.share(us)
    sites = ctx.signal("sync", "call_sites", {})
    return [
        finding(
            id="synchronization.host_device",
            category="synchronization",
            severity=severity_for(share, SYNC_SHARE) if share >= SYNC_SHARE else "info",
            title=f"The host waits for the GPU in synchronisations: {ms(us)} per step ({pct(share)})"
            + (f", mostly in {next(iter(by_op))}" if by_op else ""),
            evidence={"syncs_per_step_incl_copies": count, "sync_us_per_step": us, "step_share": share, "by_op_us_per_step": by_op, "call_sites_us_per_step": sites},
            time_share=share,
            recommendation=(
                "Each sync stalls the CPU until the GPU drains, so the next kernels are launched late. Remove "
                ".item()/.cpu()/print()/torch.cuda.synchronize()/nonzero() from the per-step path (accumulate on the GPU "
                "and read every N steps); find them with torch.cuda.set_sync_debug_mode('warn')."
                + (f" Call sites: {', '.join(list(sites)[:3])}." if sites else "")
            ),
        )
    ]
