"""Memory rules: leaks, churn and allocator fragmentation (measurements.memory, analysis/memory.py).

A leak and churn cost memory, not step time, so their findings carry no time share and rank after every
finding that does (engine.rank); fragmentation costs the time of the cudaMalloc/cudaFree calls inside
steady-state steps where there are any. The near-capacity rule lives in rules_device.py.
"""

from __future__ import annotations

from typing import Optional

from torchscope.analysis.memory_steps import UNKNOWN_SITE
from torchscope.diagnose.context import Context, ms
from torchscope.diagnose.rule import WARNING, Severities, Threshold, Verdict, rule
from torchscope.report.model import Fix

MIB = 1024 * 1024

LEAK = Threshold(
    1 * MIB,
    "allocated total at step boundaries rising >= 1 MiB per step (Theil-Sen slope), with R^2 >= 0.9 and the "
    "lower end of its 90 % interval above zero, over >= 2 steps (3 boundaries: the fewest that give an interval) (I)",
)
LEAK_MIN_R2 = 0.9
LEAK_MIN_STEPS = 2
LEAK_SITE_SHARE = 0.01
CRITICAL_STEPS_UNTIL_FULL = 1000  # an epoch or less of headroom left

CHURN = Threshold(
    32 * MIB,
    "blocks allocated and freed inside the same step, neither in forward nor backward (autograd's own), "
    ">= 32 MiB per step and >= 25 % of the device's peak (I)",
)
CHURN_PEAK_SHARE = 0.25

FRAGMENTATION = Threshold(
    1.5,
    "reserved >= 1.5x allocated at the peak with >= 512 MiB between them, or any cudaMalloc/cudaFree inside "
    "steady-state steps (PyTorch CUDA semantics: the caching allocator)",
)
FRAGMENTATION_MIN_GAP = 512 * MIB


def mib(nbytes: float) -> str:
    """Bytes for a title: `4.0 MiB`."""
    return f"{nbytes / MIB:.1f} MiB"


@rule(
    "memory.leak",
    "memory",
    LEAK,
    severity=WARNING,
    fixes=(
        Fix(
            kind="code_change",
            target="Tensor.detach",
            value="history.append(loss.item())",
            summary="keep numbers (or detached CPU copies), not tensors and their autograd graph, across steps",
        ),
        Fix(kind="code_change", target="del", value="del outputs, loss", summary="drop references to per-step tensors"),
    ),
)
def memory_leak(ctx: Context) -> Optional[Verdict]:
    """Allocated memory that grows step after step: blocks allocated in each step outlive it."""
    memory = ctx.report.measurements.memory
    # Where the totals miss frees the trace lacks, the line is no evidence (trace_quality.unrecorded_frees).
    rising = {device: slope for device, slope in _rising(ctx).items() if device not in memory.growth_misses_frees}
    if not rising:
        return None
    device, slope = max(rising.items(), key=lambda kv: kv[1])
    sites = _leak_sites(ctx, slope)
    named = [site for site in sites if site != UNKNOWN_SITE]  # a trace without stacks or call stacks names none
    until_full = _steps_until_full(ctx, device, slope)
    where = f", mostly from {named[0]}" if named else ""
    return Verdict(
        title=f"Memory on {device} grows by {mib(slope)} every step{where}",
        share=None,
        evidence={
            "device": device,
            "growth_bytes_per_step": slope,
            "growth_r2": memory.growth_r2.get(device, 0.0),
            "steps_measured": memory.growth_steps.get(device, 0.0),
            "surviving_bytes_per_step_by_call_site": sites,
            "steps_until_full": until_full,
        },
        recommendation=(
            "Something keeps a reference to tensors made in each step (a list of losses or outputs, a cache, "
            "hooks that store activations)"
            + (f": {', '.join(named)}" if named else "")
            + ". Keep `loss.item()` or `t.detach().cpu()` instead of the tensor, and drop per-step references."
            + (f" At this rate {device} is full in about {until_full} steps." if until_full is not None else "")
        ),
    )


def _leak_sites(ctx: Context, slope: float) -> dict[str, float]:
    """The call sites that keep a part of the growth worth naming (a 4-byte scalar beside 8 MiB of
    activations is not), largest first."""
    sites = ctx.report.measurements.memory.leak_sites_bytes_per_step
    return {site: size for site, size in list(sites.items())[:3] if size >= LEAK_SITE_SHARE * slope}


def _rising(ctx: Context) -> dict[str, float]:
    """The devices whose allocated total rises as LEAK says, with their slopes."""
    memory = ctx.report.measurements.memory
    return {
        device: slope
        for device, slope in memory.growth_bytes_per_step.items()
        if slope >= LEAK.value and memory.growth_r2.get(device, 0.0) >= LEAK_MIN_R2
        and memory.growth_steps.get(device, 0.0) >= LEAK_MIN_STEPS and _interval_above_zero(ctx, device)
    }  # fmt: skip


UNRECORDED_FREES = Threshold(
    1,
    "a block allocated again at an address the trace still held (its free went unrecorded), on a device whose "
    "allocated total counts only recorded events (c10's CPU allocator) and rises as memory.leak says (I)",
)


@rule(
    "trace_quality.unrecorded_frees",
    "trace_quality",
    UNRECORDED_FREES,
    fixes=(
        Fix(
            kind="code_change",
            target="memory check without the profiler",
            value="psutil.Process().memory_info().rss (CPU) or torch.cuda.memory_allocated() every N steps",
            summary="a leak keeps rising over a few hundred steps; blocks freed on other threads do not",
        ),
    ),
)
def unrecorded_frees(ctx: Context) -> Optional[Verdict]:
    """The allocated total rises, but the trace lacks frees on that device: no verdict on a leak."""
    memory = ctx.report.measurements.memory
    rising = {device: slope for device, slope in _rising(ctx).items() if device in memory.growth_misses_frees}
    if not rising:
        return None
    device, slope = max(rising.items(), key=lambda kv: kv[1])
    lost = memory.unrecorded_frees_per_step.get(device, 0.0)
    doubtful = memory.unrecorded_bytes_per_step.get(device, 0.0)
    sites = _leak_sites(ctx, slope)
    named = [site for site in sites if site != UNKNOWN_SITE]
    return Verdict(
        title=(
            f"Memory on {device} seems to grow by {mib(slope)} every step, but the trace misses frees there "
            "(blocks allocated again at an address it still held): no verdict on a leak"
        ),
        share=None,
        evidence={
            "device": device,
            "growth_bytes_per_step": slope,
            "growth_r2": memory.growth_r2.get(device, 0.0),
            "steps_measured": memory.growth_steps.get(device, 0.0),
            "unrecorded_frees_per_step": lost,
            "never_freed_bytes_per_step_of_those_sizes": doubtful,
            "surviving_bytes_per_step_by_call_site": sites,
        },
        recommendation=(
            "The profiler records a free only on a thread it follows; tensors whose last reference drops on "
            "another thread (a collective backend's, as FSDP's buffers on gloo) leave none, and this "
            f"allocator's total never goes down for them. Of the growth, {mib(doubtful)} per step are blocks of "
            "the sizes whose frees went missing"
            + (f"; the other blocks that outlive their step come from {', '.join(named)}" if named else "")
            + ". To tell a leak, log the memory without the profiler every N steps over a few hundred steps "
            "(psutil.Process().memory_info().rss on the CPU, torch.cuda.memory_allocated() on a GPU): a leak "
            "keeps rising."
        ),
    )


def _interval_above_zero(ctx: Context, device: str) -> bool:
    fit = ctx.report.memory.growth.get(device)
    return fit is None or fit.low_bytes_per_step > 0  # a merged report without details keeps the slope's word


def _steps_until_full(ctx: Context, device: str, slope: float) -> Optional[int]:
    """Steps until the device's capacity at this rate (None: capacity unknown, e.g. the CPU)."""
    capacity = ctx.report.device.total_memory_bytes
    if not device.startswith("cuda") or not capacity or slope <= 0:
        return None
    peak = ctx.report.memory.peak_reserved_bytes.get(device) or ctx.report.memory.peak_allocated_bytes.get(device, 0)
    return max(int((capacity - peak) // slope), 0)


@rule(
    "memory.churn",
    "memory",
    CHURN,
    fixes=(
        Fix(kind="code_change", target="out=", value="torch.matmul(a, b, out=buffer)", summary="preallocate buffers reused every step"),
        Fix(kind="code_change", target="in-place ops", value="x.mul_(scale)", summary="update tensors in place where autograd allows"),
        Fix(kind="code_change", target="torch.inference_mode", value="with torch.inference_mode():", summary="no autograd buffers where no gradient is needed"),
        Fix(kind="code_change", target="Optimizer.zero_grad", value="optimizer.zero_grad(set_to_none=True)", summary="free gradients instead of filling them with zeros"),
    ),
)
def memory_churn(ctx: Context) -> Optional[Verdict]:
    """Large temporaries every step: blocks allocated and freed inside the same step, outside the
    forward and backward phases (where activations and gradients come and go by design)."""
    memory = ctx.report.measurements.memory
    heavy = {
        device: churn
        for device, churn in memory.churn_bytes_per_step.items()
        if churn >= CHURN.value and churn >= CHURN_PEAK_SHARE * memory.peak_allocated_bytes.get(device, 0.0)
    }
    if not heavy:
        return None
    device, churn = max(heavy.items(), key=lambda kv: kv[1])
    sites = dict(list(memory.churn_sites_bytes_per_step.items())[:3])
    return Verdict(
        title=f"Each step allocates and frees {mib(churn)} of temporaries on {device}",
        share=None,
        evidence={
            "device": device,
            "churn_bytes_per_step": churn,
            "allocations_per_step": memory.churn_allocations_per_step.get(device, 0.0),
            "temporary_bytes_per_step_by_call_site": sites,
        },
        recommendation=(
            "Large short-lived tensors are made and dropped every step"
            + (f" ({', '.join(sites)})" if sites else "")
            + ": preallocate and reuse buffers (`out=`), use in-place ops where autograd allows, run code that "
            "needs no gradient under `torch.inference_mode()`/`torch.no_grad()`, and `zero_grad(set_to_none=True)`."
        ),
    )


@rule(
    "memory.fragmentation",
    "memory",
    FRAGMENTATION,
    severity=Severities(base="info", warning_from=0.02, critical_from=0.3),
    fixes=(
        Fix(
            kind="env_var",
            target="PYTORCH_CUDA_ALLOC_CONF",
            value="expandable_segments:True",
            summary="grow segments in place instead of caching many differently sized ones",
        ),
        Fix(
            kind="code_change",
            target="torch.cuda.empty_cache",
            value="remove torch.cuda.empty_cache() from the training loop",
            summary="the cache it gives back is allocated again from the driver in the next step",
        ),
    ),
)
def memory_fragmentation(ctx: Context) -> Optional[Verdict]:
    """The caching allocator holds far more than is allocated, or returns to the driver every step."""
    memory = ctx.report.measurements.memory
    gaps = {
        device: (reserved, memory.peak_allocated_bytes.get(device, 0.0))
        for device, reserved in memory.peak_reserved_bytes.items()
        if device.startswith(("cuda", "device"))
    }
    wide = {d: (r, a) for d, (r, a) in gaps.items() if a > 0 and r >= FRAGMENTATION.value * a and r - a >= FRAGMENTATION_MIN_GAP}
    calls = memory.allocator_calls_per_step
    if not wide and calls <= 0:
        return None
    share = ctx.share(memory.allocator_us_per_step) if calls > 0 else None
    evidence: dict[str, object] = {"allocator_calls_per_step": calls, "allocator_us_per_step": memory.allocator_us_per_step}
    if wide:
        device, (reserved, allocated) = max(wide.items(), key=lambda kv: kv[1][0] - kv[1][1])
        evidence.update(device=device, peak_reserved_bytes=reserved, peak_allocated_bytes=allocated)
        title = f"The allocator reserves {mib(reserved)} on {device} for a peak of {mib(allocated)} allocated"
    elif memory.cache_releases_per_step > 0:
        releases = memory.cache_releases_per_step
        every = "every step" if releases >= 1 else f"every {1 / releases:.3g} steps"
        title = (
            f"torch.cuda.empty_cache() gives the cache back {every}: {releases:.1f} cudaFree "
            f"per step, and cudaMalloc to take it again ({calls:.1f} calls, {ms(memory.allocator_us_per_step)} per step)"
        )
    else:
        title = f"cudaMalloc/cudaFree run {calls:.1f} times per step ({ms(memory.allocator_us_per_step)}) after warm-up"
    if memory.cache_releases_per_step > 0:
        evidence["cache_releases_per_step"] = memory.cache_releases_per_step
        advice = (
            "Frees outside any operator are the cache given back on request (torch.cuda.empty_cache()); the next step "
            "allocates it again from the driver, and cudaFree synchronises the device. Remove empty_cache() from the loop "
            "(it frees nothing the allocator would not reuse); if memory is short, see the memory findings."
        )
        targets: Optional[tuple[str, ...]] = ("torch.cuda.empty_cache",) if not wide else None
    else:
        advice = ""
        targets = ("PYTORCH_CUDA_ALLOC_CONF",)
    return Verdict(
        title=title,
        share=share,
        evidence=evidence,
        recommendation=(
            (advice + " " if advice else "")
            + (
                "The CUDA caching allocator is fragmented (blocks of changing sizes) or keeps going back to the driver. "
                "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; keep tensor shapes stable across steps "
                "(pad variable-length batches to a few bucket sizes)."
                if wide or not advice
                else ""
            )
        ).strip(),
        fix_targets=targets,
    )
