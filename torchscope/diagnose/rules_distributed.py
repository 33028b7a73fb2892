"""Communication (single trace) and straggler (across ranks) rules."""

from __future__ import annotations

from typing import Optional

import numpy as np

from torchscope.diagnose.context import Context, ms, pct
from torchscope.diagnose.rule import Threshold, Verdict, by_share, rule
from torchscope.report.model import Fix

COMMUNICATION = Threshold(0.10, "warning above 10 % of the step (TB)")


@rule(
    "communication.share",
    "communication",
    COMMUNICATION,
    severity=by_share(COMMUNICATION.value),
    fixes=(
        Fix(
            kind="code_change",
            target="DistributedDataParallel.no_sync",
            value="with model.no_sync(): loss.backward()",
            summary="with gradient accumulation, all-reduce only on the last micro-step",
        ),
    ),
)
def communication_share(ctx: Context) -> Optional[Verdict]:
    """Collective communication not hidden behind compute."""
    share = ctx.breakdown_share("communication") if ctx.has_device else ctx.phase_share("communication")
    if share <= 0:
        return None
    return Verdict(
        title=f"Collective communication takes {pct(share)} of the step ({ms(share * ctx.mean_step_us)}) "
        "without overlapping compute",
        share=share,
        evidence={"communication_us_per_step": share * ctx.mean_step_us, "ranks": len(ctx.report.ranks)},
        recommendation=(
            "Overlap or reduce communication: with DDP keep gradient bucketing on (tune bucket_cap_mb), use "
            "gradient accumulation with model.no_sync() on the first N-1 micro-steps, a larger batch per rank, "
            "or a gradient-compression comm hook; check the interconnect (NCCL over NVLink/InfiniBand, not TCP)."
        ),
    )


STRAGGLER = Threshold(0.05, "spread >= 5 % of the mean step (MSPROF slow-rank: (max-min)/mean > 5 %)")


# No fix as data: the cause (data, hardware, rank-0-only work) is for the user to find.
@rule("straggler.rank", "straggler", STRAGGLER, severity=by_share(STRAGGLER.value))
def straggler_rank(ctx: Context) -> Optional[Verdict]:
    """One rank holds the others back: spread of step times, or of time waited in collectives."""
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
