"""Communication (single trace) and straggler (across ranks) rules."""

from __future__ import annotations

import numpy as np

from torchscope.diagnose.context import Context, finding, ms, pct, severity_for
from torchscope.report.model import Finding

# TensorBoard plugin: communication > 10 % of the step; msprof-analyze slow rank: (max-min)/mean > 5 %.
COMMUNICATION_SHARE = 0.10
STRAGGLER_SPREAD = 0.05


def communication(ctx: Context) -> list[Finding]:
    share = ctx.breakdown_share("communication") if ctx.has_device else ctx.phase_share("communication")
    if share <= 0:
        return []
    return [
        finding(
            id="communication.share",
            category="communication",
            severity=severity_for(share, COMMUNICATION_SHARE) if share >= COMMUNICATION_SHARE else "info",
            title=f"Collective communication takes {pct(share)} of the step ({ms(share * ctx.mean_step_us)}) "
            "without overlapping compute",
            evidence={"communication_us_per_step": share * ctx.mean_step_us, "step_share": share, "ranks": len(ctx.report.ranks)},
            time_share=share,
            recommendation=(
                "Overlap or reduce communication: with DDP keep gradient bucketing on (tune bucket_cap_mb), use "
                "gradient accumulation with model.no_sync() on the first N-1 micro-steps, a larger batch per rank, "
                "or a gradient-compression comm hook; check the interconnect (NCCL over NVLink/InfiniBand, not TCP)."
            ),
        )
    ]


def straggler(ctx: Context) -> list[Finding]:
    ranks = [r for r in ctx.report.ranks if r.steps > 0]
    if len(ranks) < 2:
        return []
    step_times = np.array([r.mean_step_us for r in ranks])
    comm = np.array([r.comm_us_per_step for r in ranks])
    compute = np.array([r.compute_us_per_step for r in ranks])
    mean_step = float(step_times.mean())
    spread = float((step_times.max() - step_times.min()) / mean_step) if mean_step else 0.0
    # Collectives end together, so the slow rank is the one that waits least in them (and computes most).
    wait_spread = float((comm.max() - comm.min()) / mean_step) if mean_step else 0.0
    slow = ranks[int(np.argmin(comm))] if wait_spread >= STRAGGLER_SPREAD else ranks[int(np.argmax(step_times))]
    worst = max(spread, wait_spread)
    if worst < STRAGGLER_SPREAD:
        return []
    return [
        finding(
            id="straggler.rank",
            category="straggler",
            severity=severity_for(worst, STRAGGLER_SPREAD),
            title=f"Rank {slow.rank} holds the others back: ranks wait up to {ms(float(comm.max() - comm.min()))} per step in collectives",
            evidence={
                "slow_rank": slow.rank,
                "step_time_spread": spread,
                "comm_wait_spread": wait_spread,
                "mean_step_us_by_rank": {str(r.rank): r.mean_step_us for r in ranks},
                "comm_us_per_step_by_rank": {str(r.rank): r.comm_us_per_step for r in ranks},
                "compute_us_per_step_by_rank": {str(r.rank): float(c) for r, c in zip(ranks, compute)},
            },
            time_share=min(worst, 1.0),
            recommendation=(
                f"Find why rank {slow.rank} is slower: uneven data (bucket samples by length), a slower host/GPU or "
                "input pipeline on that node, or extra work only that rank does (logging, checkpointing on rank 0)."
            ),
        )
    ]
