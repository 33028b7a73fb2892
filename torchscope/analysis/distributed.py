"""Cross-rank analysis: per-rank step time and communication, for straggler detection.

Communication time is the per-step "communication" category of the breakdown; compute is kernel time
(device traces) or forward+backward+optimizer (CPU traces). A rank whose collectives are short while the
others' are long is the one the others wait for (the TensorBoard plugin's "real transfer = minimum over
ranks, the rest is synchronising" view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torchscope.arrays import median
from torchscope.report.model import RankSummary, StepRow

if TYPE_CHECKING:
    from torchscope.analysis.registry import SpanKey


def rank_summaries(spans: list[tuple[SpanKey, list[StepRow]]]) -> list[RankSummary]:
    """One summary per worker (its spans in order), in the order the workers first appear."""
    workers: dict[tuple[int, str], list[tuple[SpanKey, list[StepRow]]]] = {}
    for key, rows in spans:
        workers.setdefault((key.rank, key.worker), []).append((key, rows))
    return [_summary(rank, worker, mine) for (rank, worker), mine in workers.items()]


def _summary(rank: int, worker: str, spans: list[tuple[SpanKey, list[StepRow]]]) -> RankSummary:
    steps = [row for _, rows in spans for row in rows]
    has_device = any(key.has_device for key, _ in spans)
    durations = np.array([s.duration_us for s in steps]) if steps else np.zeros(1)
    keys = {k for s in steps for k in s.breakdown}
    breakdown = {k: float(np.mean([s.breakdown.get(k, 0.0) for s in steps])) for k in sorted(keys)}
    phases = {k: float(np.mean([s.phases.get(k, 0.0) for s in steps])) for k in ("forward", "backward", "optimizer")} if steps else {}
    compute = breakdown.get("kernel") if has_device else sum(phases.values())
    return RankSummary(
        rank=rank,
        worker=worker,
        files=[key.file for key, _ in spans],
        steps=len(steps),
        mean_step_us=float(durations.mean()),
        median_step_us=float(median(durations)),
        breakdown_us=breakdown,
        comm_us_per_step=breakdown.get("communication", 0.0),
        compute_us_per_step=float(compute or 0.0),
    )
