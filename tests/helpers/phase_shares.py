"""The host-phase shares of a synthetic trace, straight from the breakdown (no pipeline)."""

from __future__ import annotations

import json

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.breakdown import phase_partition
from torchscope.analysis.steps import find_steps
from torchscope.trace.parse import parse_trace_bytes


def phase_shares(builder: TraceBuilder) -> dict[str, float]:
    """Each host phase's share of the built trace's steps (all steps pooled)."""
    events = parse_trace_bytes(json.dumps(builder.document()).encode()).events
    breakdown, _ = phase_partition(events, find_steps(events))
    total = breakdown.per_step_us.sum()
    return {c: float(breakdown.per_step_us[:, i].sum() / total) for i, c in enumerate(breakdown.categories)}
