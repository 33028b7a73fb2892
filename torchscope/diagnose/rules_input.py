"""Input pipeline rules: data loading and host-to-device copies."""

from __future__ import annotations

from torchscope.diagnose.context import Context, finding, ms, pct, severity_for
from torchscope.report.model import Finding

# TensorBoard plugin: DataLoader > 5 % of the step (data.py); msprof-analyze: > 10 ms per step.
DATA_LOADING_SHARE = 0.05


def data_loading(ctx: Context) -> list[Finding]:
    """Exposed data-loading time: the part of the step where the loop waits for the next batch and the
    device (if any) has nothing to do."""
    share = ctx.breakdown_share("data_loading")
    if share <= 0:
        return []
    exposed_us = share * ctx.mean_step_us
    single = ctx.signal("dataloader", "single_process_fetches") > 0
    multi = ctx.signal("dataloader", "multi_process_fetches") > 0
    environment = ctx.report.run.manifest.get("environment") or {}
    cpus = environment.get("cpu_count") if isinstance(environment.get("cpu_count"), int) else None
    local = environment.get("local_world_size")
    ranks_per_node = max(local if isinstance(local, int) else 1, 1)
    workers = max(min((cpus // ranks_per_node) if cpus else 4, 8), 1)
    if single:
        title = f"Data loading blocks the step: {pct(share)} of step time ({ms(exposed_us)}) with num_workers=0"
        fix = (
            f"The DataLoader loads batches in the training process (num_workers=0). Use "
            f"DataLoader(..., num_workers={workers}, pin_memory=True, persistent_workers=True, prefetch_factor=2)"
            + (f" ({cpus} CPUs / {ranks_per_node} rank(s) per node, capped at 8)" if cpus else " (start near the CPU cores per rank, then tune)")
            + "; if __getitem__ is slow, also move decoding/augmentation out of Python or onto the GPU."
        )
    else:
        title = f"Data loading is exposed: {pct(share)} of step time ({ms(exposed_us)}) spent waiting for batches"
        fix = (
            "The DataLoader workers do not keep up. Raise num_workers"
            + (f" (up to about {workers})" if cpus else "")
            + ", set persistent_workers=True and prefetch_factor=4, pin_memory=True, and make __getitem__ cheaper "
            "(pre-decoded data, faster storage, GPU augmentation)."
        )
    return [
        finding(
            id="data_loading.exposed",
            category="data_loading",
            severity=severity_for(share, DATA_LOADING_SHARE) if share >= DATA_LOADING_SHARE else "info",
            title=title,
            evidence={
                "exposed_us_per_step": exposed_us,
                "step_share": share,
                "data_loading_us_per_step_incl_hidden": ctx.phase_share("data_loading") * ctx.mean_step_us,
                "num_workers_zero": single,
                "multi_process_loader": multi,
                "cpu_count": cpus,
            },
            time_share=share,
            recommendation=fix,
        )
    ]


# nsys cuda_memcpy_async flags every pageable async copy; below this share it is only informational.
H2D_SHARE = 0.02


COPY_OPS = ("aten::to", "aten::copy_", "aten::_to_copy", "aten::cuda", "aten::cpu")


def h2d_copy(ctx: Context) -> list[Finding]:
    findings = _blocking_copies(ctx)
    count = ctx.signal("copies", "pageable_htod_per_step")
    if count <= 0:
        return findings
    us = ctx.signal("copies", "pageable_htod_us_per_step")
    share = ctx.share(us)
    return [
        finding(
            id="h2d_copy.pageable",
            category="h2d_copy",
            severity="warning" if share >= H2D_SHARE else "info",
            title=f"Host-to-device copies from pageable memory: {count:.0f} per step, {ms(us)} ({pct(share)})",
            evidence={
                "pageable_copies_per_step": count,
                "pageable_copy_us_per_step": us,
                "pageable_bytes_per_step": ctx.signal("copies", "pageable_htod_bytes_per_step"),
                "median_bandwidth_gbps": ctx.signal("copies", "pageable_bandwidth_gbps"),
                "step_share": share,
            },
            time_share=share,
            recommendation=(
                "Copy from pinned memory and let the copy overlap: DataLoader(pin_memory=True) and "
                "batch.to(device, non_blocking=True); pinned copies run at full PCIe bandwidth and do not block the host."
            ),
        )
    ] + findings


def _blocking_copies(ctx: Context) -> list[Finding]:
    """Copies that make the host wait for the device: syncs issued under aten::to / copy_ (a copy with
    non_blocking=False, or to pageable host memory)."""
    by_op: dict[str, float] = ctx.signal("sync", "by_op", {}) or {}
    blocking = {op: us for op, us in by_op.items() if op in COPY_OPS}
    if not blocking or not ctx.has_device:
        return []
    us = sum(blocking.values())
    share = ctx.share(us)
    return [
        finding(
            id="h2d_copy.blocking",
            category="h2d_copy",
            severity="warning" if share >= H2D_SHARE else "info",
            title=f"Blocking copies: the host waits {ms(us)} per step for copies to finish ({pct(share)})",
            evidence={"blocking_copy_sync_us_per_step": us, "by_op_us_per_step": blocking, "step_share": share},
            time_share=share,
            recommendation="Use tensor.to(device, non_blocking=True) from pinned memory (DataLoader(pin_memory=True)), "
            "and create tensors directly on the device (torch.zeros(..., device='cuda')) instead of copying them.",
        )
    ]
