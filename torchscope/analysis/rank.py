"""All per-rank analyses of one worker's trace files (its spans), in one small serialisable result.

`analyze_rank` is what a process-pool task runs: for each of the worker's files it reads the cached
analysis result when the file is unchanged, else loads the tables (through the table cache) and runs every
single-trace analysis; then it orders the spans and sets the rank. Only this small result crosses the
process boundary, and it is what the analysis cache stores (`analysis_cache.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from torchscope.analysis import analysis_cache, host, intervals
from torchscope.analysis.breakdown import DEVICE_CATEGORIES, PHASE_CATEGORIES, device_breakdown, phase_partition
from torchscope.analysis.device import analyze_device
from torchscope.analysis.memory import memory_summary
from torchscope.analysis.nesting import build_host_tree
from torchscope.analysis.operators import (
    merge_operator_rows,
    merge_range_rows,
    op_times,
    operator_rows,
    range_rows,
)
from torchscope.analysis.steps import find_steps
from torchscope.report.model import (
    CategoryTime,
    DeviceSummary,
    KernelRow,
    MemorySummary,
    OperatorRow,
    RangeRow,
    SpanSummary,
    StepRow,
)
from torchscope.trace.discover import TraceFileRef
from torchscope.trace.kinds import DEVICE_KINDS, Kind, kind_mask
from torchscope.trace.load import load_trace_file
from torchscope.trace.parse import BytesDone
from torchscope.trace.tables import TraceFile


class SpanResult(msgspec.Struct, kw_only=True):
    """Everything the report needs from one trace file; per-step arrays as nested lists (serialisable)."""

    file: str
    first_ts_us: float
    steps: list[StepRow]
    device_per_step: list[list[float]]
    phase_per_step: list[list[float]]
    has_device: bool
    step_source: str
    operators: list[OperatorRow]
    operators_by_shape: list[OperatorRow]
    ranges: list[RangeRow]
    kernels: list[KernelRow]
    device: DeviceSummary
    memory: MemorySummary
    signals: dict[str, Any]
    warnings: list[str]
    header: dict[str, Any]
    device_kind: str


@dataclass
class RankResult:
    rank: int
    worker: str
    spans: list[SpanResult] = field(default_factory=list)

    @property
    def steps(self) -> list[StepRow]:
        return [s for span in self.spans for s in span.steps]

    @property
    def has_device(self) -> bool:
        return any(span.has_device for span in self.spans)


def analyze_rank(
    refs: list[TraceFileRef], use_cache: bool = True, rank_fallback: int = 0, parse_jobs: int = 1,
    on_bytes: BytesDone | None = None,
) -> RankResult:
    """Analyse one rank's trace files (`parse_jobs` processes may parse each large file; `on_bytes`
    follows the parsing, see `parse_trace`)."""
    spans = [_span_result(ref.path, use_cache, parse_jobs, on_bytes) for ref in refs]
    rank = _rank_of(spans, refs, rank_fallback)
    # Spans in capture order; the rank and span index are set here, not cached with the span.
    spans.sort(key=lambda span: span.first_ts_us)
    for index, span in enumerate(spans):
        for step in span.steps:
            step.rank = rank
            step.span = index
    return RankResult(rank=rank, worker=refs[0].worker, spans=spans)


def _span_result(path: Path, use_cache: bool, parse_jobs: int = 1, on_bytes: BytesDone | None = None) -> SpanResult:
    key = analysis_cache.key_for(path) if use_cache else None
    if key is not None:
        cached = analysis_cache.load(path, key)
        if cached is not None:
            return cached
    result = analyze_span(load_trace_file(path, use_cache, parse_jobs, on_bytes))
    if key is not None:
        analysis_cache.store(path, key, result)
    return result


def _rank_of(spans: list[SpanResult], refs: list[TraceFileRef], fallback: int) -> int:
    for span in spans:
        info = span.header.get("distributedInfo")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            return int(info["rank"])
    for ref in refs:
        if ref.rank_hint is not None:
            return ref.rank_hint
    return fallback


def analyze_span(trace: TraceFile) -> SpanResult:
    """Every single-trace analysis of one file (rank and span index are set by `analyze_rank`)."""
    events = trace.events
    steps = find_steps(events)
    tree = build_host_tree(events)
    times = op_times(events, tree)
    has_device = bool(kind_mask(events.kind, DEVICE_KINDS).any())
    device_bd = device_breakdown(events, steps)
    phase_bd, phase_sets = phase_partition(events, steps)
    compute_set = intervals.union(
        np.concatenate([phase_sets["forward"][0], phase_sets["backward"][0]]),
        np.concatenate([phase_sets["forward"][1], phase_sets["backward"][1]]),
    )
    rows = []
    for i in range(len(steps)):
        rows.append(
            StepRow(
                step=int(steps.number[i]),
                rank=0,
                span=0,
                start_us=float(steps.start_us[i]),
                duration_us=float(steps.duration_us[i]),
                breakdown=_row(device_bd.categories, device_bd.per_step_us[i]) if has_device
                else _row(phase_bd.categories, phase_bd.per_step_us[i]),
                phases=_row(phase_bd.categories, phase_bd.per_step_us[i]),
            )
        )
    device = analyze_device(events, steps, times, tree, trace.header)
    signals: dict[str, Any] = {
        "launch": host.launch_overhead(events, steps),
        "sync": host.synchronization(events, steps, tree, times),
        "copies": host.host_to_device_copies(events, steps),
        "optimizer": host.optimizer_details(events, steps, tree, times),
        # Main-thread dispatch figures mean something on CPU traces only (GPU backward runs on another thread).
        "dispatch": {} if has_device else host.dispatch_overhead(events, steps, tree, times, compute_set),
        "outside_steps": host.outside_phases(events, steps, tree, phase_sets["other"]),
        "compile": host.compile_activity(events, steps),
        "dataloader": _dataloader_kind(events),
        "idle_host_ops": device.gap_host_ops,
        "idle_us_per_step": float(device.idle_us_per_step.mean()) if len(steps) and has_device else 0.0,
        "idle_explained_us_per_step": host.idle_explained_us_per_step(events, steps, device.busy) if has_device else 0.0,
        "step_numbers": steps.number.tolist(),
    }
    origin = float(steps.start_us[0]) if len(steps) else float(events.ts_us.min(initial=0.0))
    return SpanResult(
        file=trace.path,
        first_ts_us=float(events.ts_us.min(initial=0.0)),
        steps=rows,
        device_per_step=device_bd.per_step_us.tolist(),
        phase_per_step=phase_bd.per_step_us.tolist(),
        has_device=has_device,
        step_source=steps.source,
        operators=merge_operator_rows([operator_rows(events, times)]),
        operators_by_shape=merge_operator_rows([operator_rows(events, times, by_shape=True)]),
        ranges=range_rows(events),
        kernels=device.kernel_rows,
        device=device.summary,
        memory=memory_summary(events, origin),
        signals=signals,
        warnings=list(trace.warnings),
        header=trace.header,
        device_kind=_device_kind(events, device.summary, has_device),
    )


def _row(categories: tuple[str, ...], values: np.ndarray) -> dict[str, float]:
    return {c: float(v) for c, v in zip(categories, values)}


def _dataloader_kind(events: Any) -> dict[str, float]:
    fetches = np.flatnonzero(events.name_mask(lambda s: s.startswith("enumerate(DataLoader)#")))
    single = events.name_mask(lambda s: "_SingleProcessDataLoaderIter" in s, fetches)
    multi = events.name_mask(lambda s: "_MultiProcessingDataLoaderIter" in s, fetches)
    return {"single_process_fetches": float(single.sum()), "multi_process_fetches": float(multi.sum())}


def _device_kind(events: Any, summary: DeviceSummary, has_device: bool) -> str:
    if not has_device:
        return "cpu"
    runtime_names = events.name_mask(lambda s: s.startswith("hip")) & (events.kind == Kind.RUNTIME)
    if runtime_names.any() or "AMD" in summary.name or "Radeon" in summary.name or "Instinct" in summary.name:
        return "rocm"
    return "cuda"


def span_summary(span: SpanResult, rank: int) -> SpanSummary:
    per_step = np.asarray(span.device_per_step if span.has_device else span.phase_per_step, dtype=float)
    per_step = per_step.reshape(len(span.steps), -1) if per_step.size else per_step.reshape(0, 0)
    categories = DEVICE_CATEGORIES if span.has_device else PHASE_CATEGORIES
    mean_step = float(np.mean([s.duration_us for s in span.steps])) if span.steps else 0.0
    means = per_step.mean(axis=0) if per_step.shape[0] and per_step.shape[1] else np.zeros(len(categories))
    return SpanSummary(
        rank=rank,
        file=Path(span.file).name,
        steps=[s.step for s in span.steps],
        mean_step_us=mean_step,
        breakdown={
            c: CategoryTime(us=float(v), percent=100.0 * float(v) / mean_step if mean_step else 0.0)
            for c, v in zip(categories, means)
        },
    )
