"""Communication (single trace) and straggler (across ranks) rules."""

from __future__ import annotations

from typing import Optional

import numpy as np

from torchscope.diagnose.context import Context, ms, pct
from torchscope.diagnose.rule import Threshold, Verdict, by_share, rule
from torchscope.diagnose.rules_quality import recorded_bounds
from torchscope.report.distributed import Straggler
from torchscope.report.model import Fix

COMMUNICATION = Threshold(0.10, "warning above 10 % of the step (TB)")


DDP_FIXES = (
    Fix(
        kind="code_change",
        target="DistributedDataParallel.no_sync",
        value="with model.no_sync(): loss.backward()",
        summary="with gradient accumulation, all-reduce only on the last micro-step",
    ),
    Fix(
        kind="code_change",
        target="DistributedDataParallel.bucket_cap_mb",
        value=None,
        summary="tune the gradient bucket size so all-reduces start earlier and overlap the backward pass",
    ),
    Fix(
        kind="code_change",
        target="DistributedDataParallel.register_comm_hook",
        value="torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook",
        summary="compress gradients before the all-reduce (half the bytes on the wire)",
    ),
)
# FSDP2 (`fully_shard`): all-gathers before each unit's forward and again before its backward (non-root
# units are resharded after forward by default; the root is not), reduce-scatters after its backward.
FSDP2_FIXES = (
    Fix(
        kind="code_change",
        target="FSDPModule.set_modules_to_forward_prefetch",
        value="blocks[i].set_modules_to_forward_prefetch([blocks[i + 1], blocks[i + 2]])",
        summary="issue the next units' all-gathers earlier so they overlap this unit's compute (also set_modules_to_backward_prefetch)",
    ),
    Fix(
        kind="code_change",
        target="fully_shard.reshard_after_forward",
        value="fully_shard(block, reshard_after_forward=False)  # the last blocks; the root already is",
        summary="keep a unit's parameters gathered from forward to backward: no second all-gather, at the cost of their memory",
    ),
    Fix(
        kind="code_change",
        target="fully_shard(block)",
        value="for block in model.blocks: fully_shard(block)  # then fully_shard(model)",
        summary="one unit per block: each block's all-gather can overlap the compute of the one before",
    ),
)
# FSDP1 (`FullyShardedDataParallel`): the same collectives, configured through the constructor
# (backward_prefetch=BACKWARD_PRE is its default already).
FSDP1_FIXES = (
    Fix(
        kind="code_change",
        target="FullyShardedDataParallel.forward_prefetch",
        value="FullyShardedDataParallel(model, forward_prefetch=True)",
        summary="issue the next unit's all-gather before the current unit's forward (a static graph; helps where the host issues them late)",
    ),
    Fix(
        kind="code_change",
        target="FullyShardedDataParallel.sharding_strategy",
        value="ShardingStrategy.SHARD_GRAD_OP",
        summary="keep parameters gathered from forward to backward: no second all-gather, at the cost of their memory",
    ),
    Fix(
        kind="code_change",
        target="FullyShardedDataParallel.auto_wrap_policy",
        value="FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}))",
        summary="one unit per block: each block's all-gather can overlap the compute of the one before",
    ),
)
COMM_FIXES = DDP_FIXES + FSDP2_FIXES + FSDP1_FIXES
_WRAPPER_FIXES = {
    "fully_shard": ("FSDPModule.set_modules_to_forward_prefetch", "fully_shard.reshard_after_forward"),
    "FullyShardedDataParallel": ("FullyShardedDataParallel.forward_prefetch", "FullyShardedDataParallel.sharding_strategy"),
}
# A model that is one FSDP unit all-gathers every parameter at once before its forward, with nothing to
# overlap: prefetching and resharding options change nothing there (the root is never resharded).
_ONE_UNIT_FIXES = {"fully_shard": ("fully_shard(block)",), "FullyShardedDataParallel": ("FullyShardedDataParallel.auto_wrap_policy",)}


def _fix_targets(ctx: Context, fallback: tuple[str, ...]) -> tuple[str, ...]:
    parallel = ctx.report.measurements.data_parallel
    if parallel.wrapper in _ONE_UNIT_FIXES and 0 < parallel.units_per_forward <= 1:
        return _ONE_UNIT_FIXES[parallel.wrapper]
    return _WRAPPER_FIXES.get(parallel.wrapper, fallback)


@rule(
    "communication.share",
    "communication",
    COMMUNICATION,
    severity=by_share(COMMUNICATION.value),
    fixes=COMM_FIXES,
)
def communication_share(ctx: Context) -> Optional[Verdict]:
    """Collective transfer not hidden behind compute. With collectives matched across ranks only the
    transfer counts (the shortest instance of each collective, less its overlap with compute): the time
    ranks wait for a late rank is the straggler's, and no interconnect advice would shorten it."""
    distributed = ctx.report.distributed
    if distributed.present and distributed.matched:
        return _exposed_transfer(ctx)
    share = ctx.breakdown_share("communication") if ctx.has_device else ctx.phase_share("communication")
    share *= 1.0 - _redundant_part(ctx)
    if share <= 0:
        return None
    wrapper = ctx.report.measurements.data_parallel.wrapper
    return Verdict(
        title=f"Collective communication takes {pct(share)} of the step ({ms(share * ctx.mean_step_us)}) "
        "without overlapping compute" + _apart(ctx, share * ctx.mean_step_us),
        share=share,
        evidence={"communication_us_per_step": share * ctx.mean_step_us, "ranks": len(ctx.report.ranks), "wrapper": wrapper},
        recommendation=_advice(ctx),
        fix_targets=_fix_targets(ctx, ("DistributedDataParallel.no_sync",)),
    )


_INTERCONNECT = "check the interconnect (NCCL over NVLink/InfiniBand, not TCP)."
_COMM_ADVICE = {
    "fully_shard": "Overlap or reduce FSDP's communication: prefetch the next units' all-gathers further ahead "
    "(set_modules_to_forward_prefetch / set_modules_to_backward_prefetch on each unit), keep the last blocks "
    "unsharded between forward and backward with fully_shard(block, reshard_after_forward=False) so that backward "
    "does not all-gather them again (their parameters' memory stays in use; the root is never resharded), a "
    "larger batch per rank; with gradient accumulation, set_requires_gradient_sync(False) on the first N-1 "
    "micro-steps; " + _INTERCONNECT,
    "FullyShardedDataParallel": "Overlap or reduce FSDP's communication: forward_prefetch=True issues the next "
    "unit's all-gather before the current unit's forward (for a static graph; backward already prefetches with "
    "BACKWARD_PRE, the default), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP keeps parameters gathered from "
    "forward to backward (more memory; HYBRID_SHARD keeps full sharding inside a node only), a larger batch per "
    "rank; with gradient accumulation, no_sync() on the first N-1 micro-steps; " + _INTERCONNECT,
}
_ONE_UNIT_ADVICE = {
    "fully_shard": "The model is one FSDP unit ({units:.0f} per forward pass): every parameter is all-gathered at "
    "once before the forward and reduce-scattered after the backward, with no compute to overlap, and "
    "prefetching or resharding options change nothing. Shard each block as its own unit (fully_shard(block) for "
    "every transformer block, then fully_shard(model)) so that one block's all-gather overlaps the compute of "
    "the one before; " + _INTERCONNECT,
    "FullyShardedDataParallel": "The model is one FSDP unit ({units:.0f} per forward pass): every parameter is "
    "all-gathered at once before the forward, with no compute to overlap, and prefetching options change "
    "nothing. Wrap each block as its own unit (auto_wrap_policy=ModuleWrapPolicy({{Block}}), or "
    "size_based_auto_wrap_policy) so that one block's all-gather overlaps the compute of the one before; "
    + _INTERCONNECT,
}
_DDP_ADVICE = (
    "Overlap or reduce communication: with DDP keep gradient bucketing on (tune bucket_cap_mb), use "
    "gradient accumulation with model.no_sync() on the first N-1 micro-steps, a larger batch per rank, "
    "or a gradient-compression comm hook; " + _INTERCONNECT
)


def _advice(ctx: Context) -> str:
    """What overlaps or reduces the collectives of this data-parallel wrapper (DDP's advice otherwise)."""
    parallel = ctx.report.measurements.data_parallel
    if parallel.wrapper in _ONE_UNIT_ADVICE and 0 < parallel.units_per_forward <= 1:
        return _ONE_UNIT_ADVICE[parallel.wrapper].format(units=parallel.units_per_forward)
    return _COMM_ADVICE.get(parallel.wrapper, _DDP_ADVICE)


def _exposed_transfer(ctx: Context) -> Optional[Verdict]:
    distributed = ctx.report.distributed
    wrapper = ctx.report.measurements.data_parallel.wrapper
    exposed_us = distributed.exposed_transfer_us_per_step * (1.0 - _redundant_part(ctx))
    share = ctx.share(exposed_us)
    if share <= 0:
        return None
    waiting = f"; waiting for late ranks ({ms(distributed.wait_us_per_step)}) is the straggler's" if distributed.wait_us_per_step > 0 else ""
    return Verdict(
        title=f"Collective transfer not overlapped with compute takes {pct(share)} of the step "
        f"({ms(exposed_us)}){waiting}{_apart(ctx, exposed_us)}",
        share=share,
        evidence={
            "exposed_transfer_us_per_step": distributed.exposed_transfer_us_per_step,
            "transfer_us_per_step": distributed.transfer_us_per_step,
            "wait_us_per_step": distributed.wait_us_per_step,
            "matched_collectives": distributed.matched,
            "match_method": distributed.match_method,
            "ranks": distributed.world_size,
            "wrapper": wrapper,
        },
        recommendation=_advice(ctx),
        fix_targets=_fix_targets(ctx, tuple(f.target for f in DDP_FIXES)),
    )


def _redundant_part(ctx: Context) -> float:
    """The part of the exposed collective time that `no_sync()` would skip (the redundant gradient syncs'
    share of every all-reduce and reduce-scatter not overlapped by compute): that part of the
    communication is `communication.accumulation_sync`'s, not this finding's. All-gathers and other
    collectives count as collectives that stay."""
    sync = ctx.report.measurements.grad_sync
    if not redundant_syncs(ctx) or sync.collective_exposed_us_per_step <= 0:
        return 0.0
    return min(sync.redundant_exposed_us_per_step / sync.collective_exposed_us_per_step, 1.0)


def _apart(ctx: Context, us: float) -> str:
    part = _redundant_part(ctx)
    if part <= 0 or part >= 1:
        return ""
    return f"; {ms(us * part / (1.0 - part))} more, synchronising gradients in every micro-step, is reported apart"


ACCUMULATION_SYNC = Threshold(1.5, ">= 1.5 gradient synchronisations per step on average, in the backward of different micro-steps (I; DDP docs: no_sync)")


def redundant_syncs(ctx: Context) -> bool:
    """Whether steps accumulate gradients over micro-steps and synchronise them again before an optimizer
    step reads them."""
    sync = ctx.report.measurements.grad_sync
    return (
        sync.syncing_micro_steps_per_step >= ACCUMULATION_SYNC.value
        and sync.redundant_micro_steps_per_step > 0
        and sync.redundant_sync_us_per_step > 0
    )


_NO_SYNC_FIXES = {
    "DistributedDataParallel": "DistributedDataParallel.no_sync",
    "FullyShardedDataParallel": "FullyShardedDataParallel.no_sync",
    "fully_shard": "FSDPModule.set_requires_gradient_sync",
}


@rule(
    "communication.accumulation_sync",
    "communication",
    ACCUMULATION_SYNC,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="DistributedDataParallel.no_sync",
            value="with model.no_sync() if i < accumulation_steps - 1 else contextlib.nullcontext(): loss.backward()",
            summary="accumulate gradients locally on the first N-1 micro-steps; all-reduce once, in the last backward",
        ),
        Fix(
            kind="code_change",
            target="FullyShardedDataParallel.no_sync",
            value="with model.no_sync() if i < accumulation_steps - 1 else contextlib.nullcontext(): loss.backward()",
            summary="reduce-scatter once per step (the unsharded gradients are kept in memory meanwhile)",
        ),
        Fix(
            kind="code_change",
            target="FSDPModule.set_requires_gradient_sync",
            value="model.set_requires_gradient_sync(i == accumulation_steps - 1)",
            summary="reduce-scatter only in the last micro-step's backward",
        ),
    ),
)
def communication_accumulation_sync(ctx: Context) -> Optional[Verdict]:
    """Gradient accumulation that synchronises the gradients in every micro-step: N forward and backward
    passes per optimizer step, each backward all-reducing (reduce-scattering) the whole gradient, where one
    synchronisation, in the last, gives the same result."""
    sync = ctx.report.measurements.grad_sync
    if not redundant_syncs(ctx):
        return None
    # The collectives' time not hidden by compute, scaled as communication is by the profiler, up to all of
    # their wall time over the unprofiled step (overlapped collectives still take CPU cores, SMs and bandwidth).
    low, high = recorded_bounds(ctx, sync.redundant_exposed_us_per_step, sync.redundant_sync_us_per_step, "communication")
    target = _NO_SYNC_FIXES.get(sync.wrapper, "DistributedDataParallel.no_sync")
    how = {
        "FullyShardedDataParallel.no_sync": "run the first N-1 backward passes under model.no_sync() (FSDP keeps their "
        "unsharded gradients in memory until the last)",
        "FSDPModule.set_requires_gradient_sync": "call model.set_requires_gradient_sync(False) before the first N-1 "
        "backward passes and set_requires_gradient_sync(True) before the last",
    }.get(target, "run the first N-1 backward passes under model.no_sync()")
    wrapper = sync.wrapper or "data-parallel"
    verb = "reduce-scatters" if target != "DistributedDataParallel.no_sync" else "all-reduces"
    return Verdict(
        title=f"Gradient accumulation synchronises gradients in {sync.syncing_micro_steps_per_step:.0f} of "
        f"{sync.micro_steps_per_step:.0f} micro-steps per step: {ms(sync.redundant_sync_us_per_step)} of "
        "collectives per step are redundant",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "wrapper": sync.wrapper,
            "micro_steps_per_step": sync.micro_steps_per_step,
            "syncing_micro_steps_per_step": sync.syncing_micro_steps_per_step,
            "redundant_micro_steps_per_step": sync.redundant_micro_steps_per_step,
            "gradient_sync_us_per_step": sync.sync_us_per_step,
            "redundant_sync_us_per_step": sync.redundant_sync_us_per_step,
            "redundant_exposed_us_per_step": sync.redundant_exposed_us_per_step,
        },
        recommendation=(
            f"Each backward pass of the {wrapper} model {verb} the whole gradient, yet the "
            "optimizer steps once per step: only the last micro-step's synchronisation is needed. "
            f"{how[0].upper()}{how[1:]}; the summed gradients are the same. Accelerate's accelerator.accumulate(model) "
            "and Lightning's accumulate_grad_batches do this for you."
        ),
        fix_targets=(target,),
    )


STRAGGLER = Threshold(0.05, "late rank: median lateness >= 5 % of the mean step, else spread (MSPROF slow-rank: (max-min)/mean > 5 %)")


# No fix as data: the cause (data, hardware, rank-0-only work) is for the user to find; the finding names it.
@rule("straggler.rank", "straggler", STRAGGLER, severity=by_share(STRAGGLER.value))
def straggler_rank(ctx: Context) -> Optional[Verdict]:
    """One rank holds the others back. With collectives matched across ranks: the rank that arrives last
    (the others wait for it), by how much per step, the phase that makes it late and what in that phase;
    otherwise the spread of step times, or of time spent in collectives."""
    distributed = ctx.report.distributed
    if distributed.present and distributed.matched:
        return _late_rank(ctx)
    return _spread(ctx)


_PHASE_TEXT = {
    "data_loading": "data loading",
    "forward": "forward pass",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    "outside_step": "work outside data loading/forward/backward/optimizer",
}
_PHASE_ADVICE = {
    "data_loading": "make its input pipeline as fast as the others' (more DataLoader workers, pinned memory, "
    "the same storage and preprocessing on every node, samples of even cost per rank)",
    "forward": "even out the forward work per rank (inputs of equal size per rank, e.g. bucket samples by "
    "length; no rank-specific branches in the model; same hardware and clocks on every node)",
    "backward": "even out the backward work per rank (equal input sizes, no extra hooks or parameters on one rank)",
    "optimizer": "give every rank the same optimizer work (no rank-only parameter updates or EMA copies)",
    "outside_step": "move the extra per-step work out of the loop, to every N steps or a background thread "
    "(logging, metrics, checkpointing on rank 0)",
}


def _late_rank(ctx: Context) -> Optional[Verdict]:
    distributed = ctx.report.distributed
    late = distributed.straggler
    if late is None:
        return None
    share = ctx.share(late.median_lateness_us)
    phase = late.late_phase
    culprits = ", ".join(list(late.culprits_us_per_step)[:2])
    why = ""
    if phase is not None:
        why = f": its {_PHASE_TEXT[phase]} takes {ms(late.phase_excess_us_per_step.get(phase, 0.0))} more than the median rank's"
        why += f", mostly {culprits}" if culprits else ""
    return Verdict(
        title=f"Rank {late.rank} arrives {ms(late.median_lateness_us)} late at the collectives per step "
        f"(last in {late.late_steps} of {late.steps} steps){why}",
        share=min(share, 1.0),
        evidence={
            "straggler_rank": late.rank,
            "median_lateness_us": late.median_lateness_us,
            "mean_lateness_us": late.mean_lateness_us,
            "lateness_us_by_step": late.lateness_us_by_step,
            "late_steps": late.late_steps,
            "late_phase": phase,
            "phase_excess_us_per_step": late.phase_excess_us_per_step,
            "culprits_us_per_step": late.culprits_us_per_step,
            "wait_us_per_step": distributed.wait_us_per_step,
        },
        recommendation=f"The other ranks wait for rank {late.rank} in every collective. " + _late_why(late, phase, culprits),
    )


FEW_STEPS = 10  # a lateness over fewer steps, with no phase to show for it, may be noise
EXPLAINS_SHARE = 0.25  # slower phases explain a lateness when they add up to this share of it


def _late_why(late: Straggler, phase: Optional[str], culprits: str) -> str:
    """Where a late rank's time goes: one phase, every phase a little, or not its phases at all."""
    if phase:
        advice = _PHASE_ADVICE[phase]
        return f"Look at {culprits} on rank {late.rank}, and {advice}." if culprits else f"{advice[0].upper()}{advice[1:]}."
    slower = sum(max(v, 0.0) for v in late.phase_excess_us_per_step.values())
    if slower >= EXPLAINS_SHARE * late.median_lateness_us and sum(late.phase_excess_us_per_step.values()) > 0:
        return ("No single phase explains it: every phase is a little slower on that rank, which points at its host "
                "(CPU contention from other processes, a slower CPU or GPU, thermal throttling) rather than at its work.")
    net = sum(late.phase_excess_us_per_step.values())
    together = f"{ms(abs(net))} {'less' if net < 0 else 'more'} a step, against {ms(late.median_lateness_us)} late"
    return (f"Its phases take no longer than the median rank's in all ({together}), so its work is not what makes "
            "it late: it reaches the collectives later for reasons outside its "
            "steps' phases (a late start, a blocking call between steps, a busy host descheduling it at the wrong moments)."
            + (f" With {late.steps} steps that can be noise: profile more steps before acting on it." if late.steps < FEW_STEPS else ""))


def _spread(ctx: Context) -> Optional[Verdict]:
    ranks = [r for r in ctx.report.ranks if r.steps > 0]
    if len(ranks) < 2:
        return None
    step_times = np.array([r.mean_step_us for r in ranks])
    comm = np.array([r.comm_us_per_step for r in ranks])
    mean_step = float(step_times.mean())
    spread = float((step_times.max() - step_times.min()) / mean_step) if mean_step else 0.0
    # Collectives end together, so the slow rank is the one that waits least in them (and computes most).
    wait_spread = float((comm.max() - comm.min()) / mean_step) if mean_step else 0.0
    slow = ranks[int(np.argmin(comm))] if wait_spread >= STRAGGLER.value else ranks[int(np.argmax(step_times))]
    worst = max(spread, wait_spread)
    if worst < STRAGGLER.value:
        return None
    return Verdict(
        title=f"Rank {slow.rank} holds the others back: ranks wait up to {ms(float(comm.max() - comm.min()))} per step in collectives",
        share=min(worst, 1.0),
        evidence={
            "slow_rank": slow.rank,
            "step_time_spread": spread,
            "comm_wait_spread": wait_spread,
            "mean_step_us_by_rank": {str(r.rank): r.mean_step_us for r in ranks},
            "comm_us_per_step_by_rank": {str(r.rank): r.comm_us_per_step for r in ranks},
            "compute_us_per_step_by_rank": {str(r.rank): float(r.compute_us_per_step) for r in ranks},
        },
        recommendation=(
            f"Find why rank {slow.rank} is slower: uneven data (bucket samples by length), a slower host/GPU or "
            "input pipeline on that node, or extra work only that rank does (logging, checkpointing on rank 0)."
        ),
    )
