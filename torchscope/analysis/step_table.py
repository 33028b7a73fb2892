"""The step table: one row per step with its breakdown, and what the run-level views derive from it
(mean breakdown and phases, per-span and per-rank summaries)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import msgspec
import numpy as np

from torchscope.analysis.breakdown import DEVICE_CATEGORIES, PHASE_CATEGORIES
from torchscope.analysis.distributed import rank_summaries
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.report.model import CategoryTime, SpanSummary, StepRow
from torchscope.text import path_text


class StepTable(msgspec.Struct, kw_only=True):
    """The steps of one span (rank and span index are set when the run is reduced)."""

    rows: list[StepRow]


def extract_steps(span: SpanInput) -> StepTable:
    steps = span.steps
    phases = span.phase_breakdown
    main = span.device_breakdown if span.has_device else phases
    rows = [
        StepRow(
            step=int(steps.number[i]),
            rank=0,
            span=0,
            start_us=float(steps.start_us[i]),
            duration_us=float(steps.duration_us[i]),
            breakdown=_row(main.categories, main.per_step_us[i]),
            phases=_row(phases.categories, phases.per_step_us[i]),
        )
        for i in range(len(steps))
    ]
    return StepTable(rows=rows)


def _row(categories: tuple[str, ...], values: np.ndarray) -> dict[str, float]:
    return {c: float(v) for c, v in zip(categories, values)}


def reduce_steps(parts: list[Part[StepTable]]) -> dict[str, Any]:
    """Steps in rank and capture order, the mean breakdown over all steps, and per-span/per-rank views."""
    steps = []
    for part in parts:
        for row in part.value.rows:
            steps.append(msgspec.structs.replace(row, rank=part.key.rank, span=part.key.span))
    has_device = any(p.key.has_device for p in parts)
    mean_step = _mean([s.duration_us for s in steps])
    return {
        "steps": steps,
        "breakdown": mean_breakdown(steps, DEVICE_CATEGORIES if has_device else PHASE_CATEGORIES, mean_step, phases=False),
        "phases": mean_breakdown(steps, PHASE_CATEGORIES, mean_step, phases=True),
        "spans": [_span_summary(part) for part in parts],
        "ranks": rank_summaries([(p.key, p.value.rows) for p in parts]),
    }


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def mean_breakdown(steps: list[StepRow], categories: Sequence[str], mean_step: float, phases: bool) -> dict[str, CategoryTime]:
    """Per category, the mean time per step and its percent of the mean step."""
    out: dict[str, CategoryTime] = {}
    for category in categories:
        mean = _mean([(s.phases if phases else s.breakdown).get(category, 0.0) for s in steps])
        out[category] = CategoryTime(us=mean, percent=100.0 * mean / mean_step if mean_step else 0.0)
    return out


def _span_summary(part: Part[StepTable]) -> SpanSummary:
    rows = part.value.rows
    categories = DEVICE_CATEGORIES if part.key.has_device else PHASE_CATEGORIES
    return SpanSummary(
        rank=part.key.rank,
        file=path_text(Path(part.key.file).name),  # JSON-safe: a file name may hold undecodable bytes
        steps=[s.step for s in rows],
        mean_step_us=_mean([s.duration_us for s in rows]),
        breakdown=mean_breakdown(rows, categories, _mean([s.duration_us for s in rows]), phases=False),
    )


STEPS = Analysis(
    name="steps",
    extract=extract_steps,
    extract_type=StepTable,
    reduce=reduce_steps,
    fills=("steps", "breakdown", "phases", "spans", "ranks"),
)
