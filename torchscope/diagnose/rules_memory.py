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
    """Allocated memory that grows step after step: blocks allocated in each step outlive it. Judged on
    the line without the blocks perhaps freed unseen where the allocator counts only recorded events."""
    memory = ctx.report.measurements.memory
    rising = _rising(ctx, leak_line=True)
    if not rising:
        return None
    device, slope = max(rising.items(), key=lambda kv: kv[1])
    sites = _leak_sites(ctx, slope)
    top = next(iter(sites), UNKNOWN_SITE)  # a trace without stacks or call stacks names no site
    named = [site for site in sites if site != UNKNOWN_SITE]
    until_full = _steps_until_full(ctx, device, slope)
    recorded = memory.growth_bytes_per_step.get(device, slope)
    evidence: dict[str, object] = {
        "device": device,
        "growth_bytes_per_step": slope,
        "growth_r2": _leak_r2(ctx, device),
        "steps_measured": memory.growth_steps.get(device, 0.0),
        "surviving_bytes_per_step_by_call_site": sites,
        "steps_until_full": until_full,
    }
    if memory.doubtful_bytes_per_step.get(device, 0.0) > 0:
        evidence |= {"recorded_growth_bytes_per_step": recorded, **_doubt(ctx, device)}
    return Verdict(
        title=f"Memory on {device} grows by {mib(slope)} every step" + (f", mostly from {top}" if top != UNKNOWN_SITE else ""),
        share=None,
        evidence=evidence,
        recommendation=(
            "Something keeps a reference to tensors made in each step (a list of losses or outputs, a cache, "
            "hooks that store activations)"
            + (f": {', '.join(named)}" if named else "")
            + ". Keep `loss.item()` or `t.detach().cpu()` instead of the tensor, and drop per-step references."
            + (f" At this rate {device} is full in about {until_full} steps." if until_full is not None else "")
            + (
                f" (The recorded total rises {mib(recorded)} per step; {mib(slope)} of it is left once the blocks the "
                "trace may have missed the frees of are taken off: see trace_quality.unrecorded_frees.)"
                if abs(recorded - slope) >= LEAK_SITE_SHARE * slope else ""
            )
        ),
    )


def _leak_sites(ctx: Context, slope: float) -> dict[str, float]:
    """The call sites that keep a part of the growth worth naming (a 4-byte scalar beside 8 MiB of
    activations is not), largest first."""
    sites = ctx.report.measurements.memory.leak_sites_bytes_per_step
    return {site: size for site, size in list(sites.items())[:3] if size >= LEAK_SITE_SHARE * slope}


def _rising(ctx: Context, leak_line: bool) -> dict[str, float]:
    """The devices whose allocated total rises as LEAK says, with their slopes: the recorded line, or
    (`leak_line`) the one without the blocks perhaps freed unseen (the recorded one in reports without it)."""
    memory = ctx.report.measurements.memory
    out = {}
    for device, recorded in memory.growth_bytes_per_step.items():
        slope = memory.leak_growth_bytes_per_step.get(device, recorded) if leak_line else recorded
        r2 = _leak_r2(ctx, device) if leak_line else memory.growth_r2.get(device, 0.0)
        if slope >= LEAK.value and r2 >= LEAK_MIN_R2 and memory.growth_steps.get(device, 0.0) >= LEAK_MIN_STEPS \
                and _interval_above_zero(ctx, device, leak_line):
            out[device] = slope
    return out


def _leak_r2(ctx: Context, device: str) -> float:
    memory = ctx.report.measurements.memory
    return memory.leak_growth_r2.get(device, memory.growth_r2.get(device, 0.0))


def _doubt(ctx: Context, device: str) -> dict[str, float]:
    memory = ctx.report.measurements.memory
    return {
        "unrecorded_frees_per_step": memory.unrecorded_frees_per_step.get(device, 0.0),
        "doubtful_bytes_per_step": memory.doubtful_bytes_per_step.get(device, 0.0),
    }


UNRECORDED_FREES = Threshold(
    1,
    "the recorded allocated total rises as memory.leak says, but not once the never-freed blocks perhaps freed "
    "unseen are taken off it (a size whose free the trace lacked: a block allocated again at an address still "
    "held; or a collective's buffer), on an allocator whose total counts only recorded events (c10's CPU) (I)",
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
    """The recorded total rises, but only by blocks the trace may have missed the frees of: no verdict."""
    memory = ctx.report.measurements.memory
    judged = _rising(ctx, leak_line=True)
    rising = {device: slope for device, slope in _rising(ctx, leak_line=False).items() if device not in judged}
    if not rising:
        return None
    device, slope = max(rising.items(), key=lambda kv: kv[1])
    doubt = _doubt(ctx, device)
    left = memory.leak_growth_bytes_per_step.get(device, 0.0)
    sites = _leak_sites(ctx, slope)
    named = [site for site in sites if site != UNKNOWN_SITE]
    proven = doubt["unrecorded_frees_per_step"] > 0
    why = (
        "the trace misses frees there (blocks allocated again at an address it still held)"
        if proven else "the growth is collectives' buffers the trace never saw freed"
    )
    return Verdict(
        title=f"Memory on {device} seems to grow by {mib(slope)} every step, but {why}: no verdict on a leak",
        share=None,
        evidence={
            "device": device,
            "growth_bytes_per_step": slope,
            "growth_r2": memory.growth_r2.get(device, 0.0),
            "steps_measured": memory.growth_steps.get(device, 0.0),
            **doubt,
            "growth_without_them_bytes_per_step": left,
            "surviving_bytes_per_step_by_call_site": sites,
        },
        recommendation=(
            "The profiler records a free only on a thread it follows: a tensor whose last reference drops on "
            "another thread (a collective backend's worker, a logging or metrics thread) leaves none, and this "
            f"allocator's total never goes down for it. {mib(doubt['doubtful_bytes_per_step'])} per step are blocks "
            "never freed in the trace that may have gone so (of a size whose free went missing, or a collective's "
            f"buffer); without them the total grows {mib(left)} per step"
            + (f", and the other blocks that outlive their step come from {', '.join(named)}" if named else "")
            + ". To tell a leak, log the memory without the profiler every N steps over a few hundred steps "
            "(psutil.Process().memory_info().rss on the CPU, torch.cuda.memory_allocated() on a GPU): a leak "
            "keeps rising."
        ),
    )


def _interval_above_zero(ctx: Context, device: str, leak_line: bool = False) -> bool:
    fit = ctx.report.memory.growth.get(device)
    if fit is None:  # a merged report without details keeps the slope's word
        return True
    return (fit.leak_low_bytes_per_step if leak_line and fit.leak_r2 else fit.low_bytes_per_step) > 0


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
