"""Input pipeline rules: data loading and host-to-device copies."""

from __future__ import annotations

from typing import Optional

from torchscope.diagnose.context import Context, ms
from torchscope.diagnose.rule import Threshold, Verdict, by_share, rule
from torchscope.report.model import Fix

DATA_LOADING = Threshold(0.05, "warning above 5 % of the step (TB `data.py`: `dataloader_ratio > 0.05`)")
MAX_SUGGESTED_WORKERS = 8  # more workers rarely help one GPU and multiply host memory

PIN_MEMORY = Fix(
    kind="dataloader_kwarg",
    target="pin_memory",
    value=True,
    summary="batches in page-locked memory: host-to-device copies run at full bandwidth and can be asynchronous",
)
NON_BLOCKING = Fix(
    kind="code_change",
    target="Tensor.to",
    value="batch.to(device, non_blocking=True)",
    summary="copy without making the host wait (the source must be pinned)",
)


@rule(
    "data_loading.exposed",
    "data_loading",
    DATA_LOADING,
    severity=by_share(DATA_LOADING.value),
    fixes=(
        Fix(
            kind="dataloader_kwarg",
            target="num_workers",
            summary="load batches in worker processes: about the CPU cores per rank, at most 8",
        ),
        PIN_MEMORY,
        Fix(kind="dataloader_kwarg", target="persistent_workers", value=True, summary="keep workers alive across epochs"),
        Fix(kind="dataloader_kwarg", target="prefetch_factor", value=2, summary="batches each worker prepares ahead"),
    ),
)
def data_loading_exposed(ctx: Context) -> Optional[Verdict]:
    """Exposed data-loading time: the part of the step where the loop waits for the next batch and the
    device (if any) has nothing to do."""
    exposed = ctx.breakdown_share("data_loading")
    if exposed <= 0:
        return None
    exposed_us = exposed * ctx.mean_step_us
    share, share_range = ctx.cost("data_loading", exposed)
    loader = ctx.report.measurements.dataloader
    single = loader.single_process_fetches > 0
    cpus, ranks_per_node = _cpus_and_ranks_per_node(ctx)
    workers = max(min((cpus // ranks_per_node) if cpus else 4, MAX_SUGGESTED_WORKERS), 1)
    if single:
        title = f"Data loading blocks the step for {ms(exposed_us)} with num_workers=0"
        fix = _single_process_text(workers, cpus, ranks_per_node)
    else:
        title = f"Data loading is exposed: the step waits {ms(exposed_us)} for batches"
        fix = _slow_workers_text(workers, cpus)
    return Verdict(
        title=title,
        share=share,
        evidence={
            "exposed_us_per_step": exposed_us,
            "data_loading_us_per_step_incl_hidden": ctx.phase_share("data_loading") * ctx.mean_step_us,
            "num_workers_zero": single,
            "multi_process_loader": loader.multi_process_fetches > 0,
            "cpu_count": cpus,
        },
        recommendation=fix,
        # Without a CPU count a loader that already has workers gets no number: its current one is unknown.
        fix_values={"num_workers": workers if single or cpus else None, "prefetch_factor": 2 if single else 4},
        # pin_memory only helps (and PyTorch only accepts it without a warning) with an accelerator.
        fix_targets=None if ctx.has_device else ("num_workers", "persistent_workers", "prefetch_factor"),
        share_range=share_range,
    )


def _cpus_and_ranks_per_node(ctx: Context) -> tuple[Optional[int], int]:
    environment = ctx.environment()
    cpus = environment.get("cpu_count") if isinstance(environment.get("cpu_count"), int) else None
    local = environment.get("local_world_size")
    return cpus, max(local if isinstance(local, int) else 1, 1)


def _single_process_text(workers: int, cpus: Optional[int], ranks_per_node: int) -> str:
    return (
        f"The DataLoader loads batches in the training process (num_workers=0). Use "
        f"DataLoader(..., num_workers={workers}, pin_memory=True, persistent_workers=True, prefetch_factor=2)"
        + (f" ({cpus} CPUs / {ranks_per_node} rank(s) per node, capped at 8)" if cpus else " (start near the CPU cores per rank, then tune)")
        + "; if __getitem__ is slow, also move decoding/augmentation out of Python or onto the GPU."
    )


def _slow_workers_text(workers: int, cpus: Optional[int]) -> str:
    return (
        "The DataLoader workers do not keep up. Raise num_workers"
        + (f" (up to about {workers})" if cpus else "")
        + ", set persistent_workers=True and prefetch_factor=4, pin_memory=True, and make __getitem__ cheaper "
        "(pre-decoded data, faster storage, GPU augmentation)."
    )


PAGEABLE = Threshold(0.02, "any is reported (NSYS `cuda_memcpy_async` flags every pageable copy); warning from 2 % of the step")


@rule(
    "h2d_copy.pageable",
    "h2d_copy",
    PAGEABLE,
    severity=by_share(PAGEABLE.value, critical_from=None),
    fixes=(PIN_MEMORY, NON_BLOCKING),
)
def h2d_copy_pageable(ctx: Context) -> Optional[Verdict]:
    """Host-to-device copies from pageable memory: staged through a driver buffer, never asynchronous."""
    copies = ctx.report.measurements.copies
    count = copies.pageable_htod_per_step
    if count <= 0:
        return None
    us = copies.pageable_htod_us_per_step
    share = ctx.share(us)
    return Verdict(
        title=f"Host-to-device copies from pageable memory: {count:.0f} per step, {ms(us)}",
        share=share,
        evidence={
            "pageable_copies_per_step": count,
            "pageable_copy_us_per_step": us,
            "pageable_bytes_per_step": copies.pageable_htod_bytes_per_step,
            "median_bandwidth_gbps": copies.pageable_bandwidth_gbps,
        },
        recommendation=(
            "Copy from pinned memory and let the copy overlap: DataLoader(pin_memory=True) and "
            "batch.to(device, non_blocking=True); pinned copies run at full PCIe bandwidth and do not block the host."
        ),
    )


BLOCKING = Threshold(0.02, "warning from 2 % of the step (NSYS `cuda_memcpy_sync`)")
COPY_OPS = ("aten::to", "aten::copy_", "aten::_to_copy", "aten::cuda", "aten::cpu")


@rule(
    "h2d_copy.blocking",
    "h2d_copy",
    BLOCKING,
    severity=by_share(BLOCKING.value, critical_from=None),
    fixes=(
        NON_BLOCKING,
        PIN_MEMORY,
        Fix(
            kind="code_change",
            target="tensor factories",
            value="torch.zeros(..., device='cuda')",
            summary="create tensors on the device instead of copying them there",
        ),
    ),
)
def h2d_copy_blocking(ctx: Context) -> Optional[Verdict]:
    """Copies that make the host wait for the device: syncs issued under aten::to / copy_ (a copy with
    non_blocking=False, or to pageable host memory)."""
    blocking = {op: us for op, us in ctx.report.measurements.sync.by_op.items() if op in COPY_OPS}
    if not blocking or not ctx.has_device:
        return None
    us = sum(blocking.values())
    all_us = sum(ctx.report.measurements.sync.by_op.values())
    share, share_range = ctx.cost("sync", ctx.share(us), scale=us / all_us if all_us else 0.0)
    return Verdict(
        title=f"Blocking copies: the host waits {ms(us)} per step for copies to finish",
        share=share,
        share_range=share_range,
        evidence={"blocking_copy_sync_us_per_step": us, "by_op_us_per_step": blocking},
        recommendation="Use tensor.to(device, non_blocking=True) from pinned memory (DataLoader(pin_memory=True)), "
        "and create tensors directly on the device (torch.zeros(..., device='cuda')) instead of copying them.",
    )
