"""The rule registry and the ranking of findings.

Every rule is `rule(ctx) -> list[Finding]`, pure, reading only the Report (through `Context`). Findings
are ranked by the share of step time they cost (most first); findings without a cost come last.
"""

from __future__ import annotations

from typing import Callable

from torchscope.diagnose import rules_device, rules_distributed, rules_host, rules_input, rules_quality
from torchscope.diagnose.context import Context, make_context
from torchscope.report.model import Finding, Report

Rule = Callable[[Context], list[Finding]]

RULES: tuple[Rule, ...] = (
    rules_input.data_loading,
    rules_input.h2d_copy,
    rules_host.host_overhead,
    rules_host.optimizer,
    rules_host.outside_steps,
    rules_host.synchronization,
    rules_device.idle,
    rules_device.compute,
    rules_device.memory,
    rules_distributed.communication,
    rules_distributed.straggler,
    rules_quality.trace_quality,
)

_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def diagnose(report: Report) -> list[Finding]:
    ctx = make_context(report)
    findings = [f for rule in RULES for f in rule(ctx)]
    findings += rules_device.compute_verdict(ctx, findings)
    return rank(_capped_by_trace_quality(ctx, findings))


def _capped_by_trace_quality(ctx: Context, findings: list[Finding]) -> list[Finding]:
    """A trace without step markers (one window that includes set-up) supports no more than a hint, and
    fewer than 3 steps no more than a warning: severities are capped, the trace_quality finding says why."""
    if ctx.report.run.step_source == "whole_trace":
        cap = "info"
    elif ctx.steps < rules_quality.MIN_STEPS:
        cap = "warning"
    else:
        return findings
    limit = _SEVERITY_ORDER[cap]
    for f in findings:
        if f.category != "trace_quality" and _SEVERITY_ORDER[f.severity] < limit:
            f.severity = cap  # type: ignore[assignment]
    return findings


def rank(findings: list[Finding]) -> list[Finding]:
    """Most costly first; ties (and findings without a cost) by severity, then id."""
    return sorted(
        findings,
        key=lambda f: (f.time_share is None, -(f.time_share or 0.0), _SEVERITY_ORDER[f.severity], f.id),
    )
