"""Figures every rule needs, computed once from the Report, and the small text helpers of titles."""

from __future__ import annotations

from typing import Any, Optional

import msgspec

from torchscope.report.model import Finding, Report


class Context(msgspec.Struct, frozen=True):
    """What a rule reads: the Report (its typed `measurements`, breakdown, steps, device) and figures
    derived from it once. `findings` holds the other rules' findings, for the verdicts that run after
    them (see `engine.VERDICTS`); it is empty for ordinary rules."""

    report: Report
    mean_step_us: float
    steps: int
    has_device: bool
    findings: tuple[Finding, ...] = ()

    def share(self, us_per_step: float) -> float:
        """`us_per_step` as a share of the mean step, clamped to 0..1."""
        return min(max(us_per_step / self.mean_step_us, 0.0), 1.0) if self.mean_step_us > 0 else 0.0

    def breakdown_share(self, category: str) -> float:
        """Share of the step of a breakdown category (each instant counted once, by priority)."""
        entry = self.report.breakdown.get(category)
        return entry.percent / 100.0 if entry else 0.0

    def phase_share(self, category: str) -> float:
        """Share of the step of a phase (data loading, forward, backward, optimizer, ...)."""
        entry = self.report.phases.get(category)
        return entry.percent / 100.0 if entry else 0.0

    def saving(self, cause: str, scale: float = 1.0) -> Optional[tuple[float, float, float]]:
        """(estimate, low, high) shares of the step a fix of `cause` saves, from the what-if model
        (measurements.savings; `scale` takes a part of it); None where the model did not cover the cause.
        The estimate is the middle of the range."""
        savings = self.report.measurements.savings
        if cause not in savings.saved_us_per_step_high:
            return None
        low = self.share(scale * savings.saved_us_per_step_low.get(cause, 0.0))
        high = self.share(scale * savings.saved_us_per_step_high[cause])
        low, high = min(low, high), max(low, high)
        return (low + high) / 2.0, low, high

    def cost(self, cause: str, fallback: float, scale: float = 1.0) -> tuple[float, tuple[float, float]]:
        """A finding's share and (low, high) range: the what-if saving of `cause`, else `fallback` (a
        measured share taken as the saving) with no range."""
        modelled = self.saving(cause, scale)
        if modelled is None:
            return fallback, (fallback, fallback)
        return modelled[0], (modelled[1], modelled[2])

    def environment(self) -> dict[str, Any]:
        """The capture manifest's `environment` (CPU count, cudnn flags, ...); empty when not recorded."""
        environment = self.report.run.manifest.get("environment")
        return environment if isinstance(environment, dict) else {}

    def cpu_matmul_peak(self) -> tuple[Optional[float], Optional[int]]:
        """The float32 matmul rate (GFLOP/s) measured at the end of a CPU capture and the threads it ran
        on (manifest environment `cpu_peak`); None where not measured."""
        measured = self.environment().get("cpu_peak")
        measured = measured if isinstance(measured, dict) else {}
        value = measured.get("matmul_gflops")
        rate = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None
        return rate, as_int(measured.get("threads"))

    def main_loader(self) -> dict[str, Any]:
        """The settings of the DataLoader iterated most (the training loader), empty when not recorded."""
        loaders = [entry for entry in self.environment().get("dataloaders") or [] if isinstance(entry, dict)]
        if not loaders:
            return {}
        return max(loaders, key=lambda entry: as_int(entry.get("iterations")) or 0)


def as_int(value: Any) -> Optional[int]:
    """`value` when it is an int (not a bool), else None: for figures read from a manifest."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def make_context(report: Report) -> Context:
    """The Context of a Report (mean step time over every step row of every rank)."""
    return Context(report, report.mean_step_us, len(report.steps), report.device.present or report.run.device_kind != "cpu")


def ms(us: float) -> str:
    """A duration for a title: `12.3 ms` from one millisecond, else `850 us`."""
    return f"{us / 1000:.1f} ms" if us >= 1000 else f"{us:.0f} us"


def pct(share: float) -> str:
    """A share for a title: `12.3%`."""
    return f"{100 * share:.1f}%"
