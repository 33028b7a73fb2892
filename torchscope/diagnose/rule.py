"""A rule declared as data beside the small function that measures and decides.

A rule is one finding id: its category, its threshold (the number and where it comes from), how its
severity follows from the time it costs, and the fixes it recommends, as data. Its function reads the
Report through a `Context` and returns a `Verdict` (title, time share, evidence, recommendation and the
concrete values of its fixes) or None; the engine turns a verdict into a `Finding`. So a rule's function
holds only what is particular to it, and the catalogue (docs, tests, `tune`) reads the declarations.

    DATA_LOADING = Threshold(0.05, "warning above 5 % of the step (TB ...)")

    @rule("data_loading.exposed", "data_loading", DATA_LOADING, severity=by_share(0.05),
          fixes=(Fix(kind="dataloader_kwarg", target="num_workers"), ...))
    def data_loading_exposed(ctx: Context) -> Verdict | None: ...
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

import msgspec

from torchscope.diagnose.context import Context
from torchscope.report.model import Category, Fix, FixValue, Severity

# Severity from the share of step time a problem costs: critical from 30 %, warning from 5 % unless a rule
# declares its own threshold.
CRITICAL_SHARE = 0.30
WARNING_SHARE = 0.05


class Threshold(msgspec.Struct, frozen=True):
    """The number a rule compares against and where it comes from (as written in docs/rules.md)."""

    value: float
    source: str


class Severities(msgspec.Struct, frozen=True):
    """How a finding's severity follows from its time share: `base` below `warning_from`, warning from
    there, critical from `critical_from` (None: never reached by share)."""

    base: Severity = "info"
    warning_from: Optional[float] = None
    critical_from: Optional[float] = None

    def of(self, share: Optional[float]) -> Severity:
        """The severity of a finding that costs `share` of the step (None: no time cost)."""
        if share is not None and self.critical_from is not None and share >= self.critical_from:
            return "critical"
        if share is not None and self.warning_from is not None and share >= self.warning_from:
            return "warning"
        return self.base


INFO = Severities()
WARNING = Severities(base="warning")


def by_share(warning_from: float = WARNING_SHARE, critical_from: Optional[float] = CRITICAL_SHARE) -> Severities:
    """Graded by time share: info, warning from `warning_from`, critical from `critical_from`."""
    return Severities(warning_from=warning_from, critical_from=critical_from)


class Verdict(msgspec.Struct, frozen=True):
    """What a rule's function decides: the finding's text and figures, and its fixes' concrete values.

    `share` is the share of the step a fix would save, within `share_range` (low, high) when the what-if
    model gives one (None: the range is `share` alone). `fix_values` fills declared fixes by target
    (num_workers=4); `fix_targets` keeps only the declared fixes with those targets, in declaration order
    (None: all of them)."""

    title: str
    share: Optional[float]
    evidence: dict[str, Any]
    recommendation: str
    fix_values: Mapping[str, FixValue] = msgspec.field(default_factory=dict)
    fix_targets: Optional[tuple[str, ...]] = None
    share_range: Optional[tuple[float, float]] = None


Measure = Callable[[Context], Optional[Verdict]]


class Rule(msgspec.Struct, frozen=True):
    """One finding id, declared: category, threshold, severity grading, fixes, and its function."""

    id: str
    category: Category
    threshold: Threshold
    severity: Severities
    fixes: tuple[Fix, ...]
    measure: Measure

    def fixes_for(self, verdict: Verdict) -> list[Fix]:
        """The declared fixes a verdict keeps, with the values it computed."""
        targets = {fix.target for fix in self.fixes}
        unknown = (set(verdict.fix_values) | set(verdict.fix_targets or ())) - targets
        if unknown:  # a typo in a rule would otherwise drop a fix silently
            raise ValueError(f"rule {self.id}: no declared fix with target {sorted(unknown)}")
        kept = [f for f in self.fixes if verdict.fix_targets is None or f.target in verdict.fix_targets]
        return [
            msgspec.structs.replace(f, value=verdict.fix_values[f.target]) if f.target in verdict.fix_values else f
            for f in kept
        ]


def rule(
    id: str,
    category: Category,
    threshold: Threshold,
    *,
    severity: Severities = INFO,
    fixes: tuple[Fix, ...] = (),
) -> Callable[[Measure], Rule]:
    """Declare the decorated function as the rule `id` (the module-level name becomes the `Rule`)."""

    def declare(measure: Measure) -> Rule:
        return Rule(id, category, threshold, severity, fixes, measure)

    return declare
