"""The rule registry, the making of findings from verdicts, and their ranking.

Every rule is declared with `rule.rule(...)` beside its function (`rules_*.py`) and listed here. `RULES`
run on the Report; `VERDICTS` run after them and also read their findings (`Context.findings`). The
engine builds each Finding (severity from the rule's declared grading, evidence rounded, fixes attached),
caps severities when the trace cannot support a verdict, and ranks findings by the share of step time
they cost (most first); findings without a cost come last.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import msgspec

from torchscope.diagnose import (
    rules_device,
    rules_distributed,
    rules_host,
    rules_input,
    rules_memory,
    rules_patterns,
    rules_quality,
)
from torchscope.diagnose.context import Context, make_context
from torchscope.diagnose.rule import Rule, Verdict
from torchscope.report.model import Finding, Report, Severity

RULES: tuple[Rule, ...] = (
    rules_input.data_loading_exposed,
    rules_input.data_loading_worker_restarts,
    rules_input.data_loading_oversubscribed_workers,
    rules_input.h2d_copy_pageable,
    rules_input.h2d_copy_blocking,
    rules_host.host_overhead_dispatch,
    rules_host.host_overhead_python,
    rules_host.host_overhead_launch_bound,
    rules_host.host_overhead_anomaly_mode,
    rules_host.host_overhead_module_hooks,
    rules_host.host_overhead_gc_pauses,
    rules_host.optimizer_step,
    rules_host.optimizer_zero_grad_fill,
    rules_host.optimizer_dense_embedding,
    rules_host.outside_steps_work,
    rules_host.synchronization_host_device,
    rules_host.synchronization_launch_blocking,
    rules_device.idle_device,
    rules_device.compute_tensor_cores_unused,
    rules_device.compute_layout_transposes,
    rules_device.compute_cudnn_benchmark_off,
    rules_device.compute_low_occupancy,
    rules_device.compute_conv_bias_before_batch_norm,
    rules_device.compute_half_matmul_misaligned,
    rules_device.compute_threads,
    rules_device.compute_recompute,
    rules_device.compute_float64,
    rules_device.compute_cpu_half_emulated,
    rules_device.compute_graph_breaks,
    rules_device.compute_recompiles,
    rules_device.compute_dropout,
    rules_device.compute_unfused_attention,
    rules_patterns.host_overhead_indexing_loop,
    rules_patterns.host_overhead_extra_device_copy,
    rules_device.memory_near_capacity,
    rules_memory.memory_leak,
    rules_memory.unrecorded_frees,
    rules_memory.memory_churn,
    rules_memory.memory_fragmentation,
    rules_distributed.communication_share,
    rules_distributed.communication_accumulation_sync,
    rules_distributed.straggler_rank,
    rules_quality.no_steps,
    rules_quality.few_steps,
    rules_quality.warmup_in_window,
    rules_quality.outlier_steps,
    rules_quality.compilation_in_window,
    rules_quality.no_device_events,
    rules_quality.partial,
    rules_quality.profiler_overhead,
    rules_quality.busy_machine,
    rules_quality.trace_thinned,
)

# Verdicts about the run as a whole, stated from what the rules above found (or did not find).
VERDICTS: tuple[Rule, ...] = (rules_device.compute_bound,)

_SEVERITY_ORDER: dict[Severity, int] = {"critical": 0, "warning": 1, "info": 2}


def diagnose(report: Report) -> list[Finding]:
    """The ranked findings of a Report (reads its measurements, breakdown, steps, device and manifest)."""
    ctx = make_context(report)
    findings = run(RULES, ctx)
    verdicts = run(VERDICTS, msgspec.structs.replace(ctx, findings=tuple(findings)))
    return headline_verdicts(rank(_capped_by_trace_quality(ctx, findings + verdicts)), {f.id for f in verdicts})


def run(rules: tuple[Rule, ...], ctx: Context) -> list[Finding]:
    """The findings of `rules` on one Context, in registry order (unranked, uncapped)."""
    found = ((r, r.measure(ctx)) for r in rules)
    return [make_finding(r, verdict) for r, verdict in found if verdict is not None]


def make_finding(rule: Rule, verdict: Verdict) -> Finding:
    """A rule's Finding from its verdict: declared id/category/fixes, severity from the declared grading,
    evidence floats rounded so reports stay readable and stable."""
    share = verdict.share
    low, high = verdict.share_range or (share, share)
    return Finding(
        id=rule.id,
        category=rule.category,
        severity=rule.severity.of(share),
        title=verdict.title,
        evidence={k: _tidy(v) for k, v in verdict.evidence.items()},
        time_share=_share(share),
        recommendation=verdict.recommendation,
        fixes=rule.fixes_for(verdict),
        time_share_low=_share(low),
        time_share_high=_share(high),
    )


def _share(share: Optional[float]) -> Optional[float]:
    return None if share is None else round(float(share), 4)


def _tidy(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None  # NaN/inf evidence (e.g. from a damaged trace) means "unknown"
        return round(value, 3) if abs(value) < 1e6 else round(value)
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def _capped_by_trace_quality(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """A trace without step markers (one window that includes set-up) supports no more than a hint, and
    fewer than 3 steps, or a window recorded while other processes took the CPUs, no more than a warning:
    severities are capped, the trace_quality finding says why."""
    cap = _severity_cap(ctx)
    if cap is None:
        return findings
    limit = _SEVERITY_ORDER[cap]
    for f in findings:
        if f.category != "trace_quality" and _SEVERITY_ORDER[f.severity] < limit:
            f.severity = cap
    return findings


def _severity_cap(ctx: Context) -> Optional[Severity]:
    if ctx.report.run.step_source == "whole_trace":
        return "info"
    if ctx.steps < rules_quality.MIN_STEPS.value or rules_quality.busy_share(ctx) is not None:
        return "warning"
    return None


def rank(findings: list[Finding]) -> list[Finding]:
    """Most costly first; ties (and findings without a cost) by severity, then id."""
    return sorted(
        findings,
        key=lambda f: (f.time_share is None, -(f.time_share or 0.0), _SEVERITY_ORDER[f.severity], f.id),
    )


def headline_verdicts(ranked: list[Finding], verdict_ids: set[str]) -> list[Finding]:
    """The run's verdict (compute-bound, ...) first when no other finding reaches warning: then it is the
    answer, and the small costs below it are details."""
    if any(f.severity != "info" and f.id not in verdict_ids and f.category != "trace_quality" for f in ranked):
        return ranked
    return [f for f in ranked if f.id in verdict_ids] + [f for f in ranked if f.id not in verdict_ids]
