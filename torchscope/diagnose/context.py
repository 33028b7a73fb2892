"""Figures every rule needs, computed once from the Report."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torchscope.report.model import Finding, Report

# Severity from the share of step time a problem costs.
CRITICAL_SHARE = 0.30
WARNING_SHARE = 0.05


@dataclass(frozen=True)
class Context:
    report: Report
    mean_step_us: float
    steps: int
    has_device: bool

    def signal(self, group: str, name: str, default: Any = 0.0) -> Any:
        values = self.report.signals.get(group)
        if not isinstance(values, dict):
            return default
        return values.get(name, default)

    def share(self, us_per_step: float) -> float:
        return min(max(us_per_step / self.mean_step_us, 0.0), 1.0) if self.mean_step_us > 0 else 0.0

    def breakdown_share(self, category: str) -> float:
        entry = self.report.breakdown.get(category)
        return entry.percent / 100.0 if entry else 0.0

    def phase_share(self, category: str) -> float:
        entry = self.report.phases.get(category)
        return entry.percent / 100.0 if entry else 0.0


def make_context(report: Report) -> Context:
    steps = report.steps
    mean = sum(s.duration_us for s in steps) / len(steps) if steps else 0.0
    return Context(report, mean, len(steps), report.device.present or report.run.device_kind != "cpu")


def severity_for(share: float, warning: float = WARNING_SHARE, critical: float = CRITICAL_SHARE) -> str:
    if share >= critical:
        return "critical"
    if share >= warning:
        return "warning"
    return "info"


def finding(**fields: Any) -> Finding:
    """Build a Finding, rounding evidence floats so reports stay readable and stable."""
    evidence = {k: _tidy(v) for k, v in fields.pop("evidence").items()}
    share = fields.pop("time_share")
    return Finding(evidence=evidence, time_share=None if share is None else round(float(share), 4), **fields)


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


def ms(us: float) -> str:
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def pct(share: float) -> str:
    return f"{100 * share:.1f}%"
