"""The regression gate: a diff fails when a change is beyond the runs' noise AND beyond its threshold.

Thresholds, as given on the command line:
* `--fail-if-slower 5%`: mean step time up by more than 5 % (and beyond noise);
* `--fail-on NAME+X%`: the metric NAME (report.metrics, e.g. `memory.peak_allocated_bytes.cpu`) worse by
  more than X % in its own direction (up for `lower`-is-better metrics, down for `higher`);
* `--fail-on CATEGORY+Xpp`: the breakdown category's share of the step (e.g. `data_loading`) up by more
  than X percentage points, its time per step rising beyond noise.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from torchscope.errors import UsageError
from torchscope.report.diff import CategoryChange, GateResult, MetricChange, ReportDiff

DEFAULT_SLOWER_PCT = 5.0
_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_.:\-]+)\+(?P<value>\d+(?:\.\d+)?)(?P<unit>%|pp)$")


class Threshold(msgspec.Struct, frozen=True):
    name: str  # "step_time", a metric name, or a breakdown category
    value: float
    unit: Literal["%", "pp"]


def parse_percent(text: str) -> float:
    """`5%` or `5` -> 5.0 (UsageError otherwise)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)%?", text.strip())
    if not match:
        raise UsageError(f"not a percentage: {text!r} (e.g. 5%)")
    return float(match.group(1))


def parse_threshold(text: str) -> Threshold:
    """`data_loading+2pp`, `memory.peak_allocated_bytes.cpu+10%` (UsageError otherwise)."""
    match = _SPEC.match(text.strip())
    if not match:
        raise UsageError(f"not a threshold: {text!r} (e.g. data_loading+2pp or memory.peak_allocated_bytes.cpu+10%)")
    return Threshold(match.group("name"), float(match.group("value")), match.group("unit"))  # type: ignore[arg-type]


def evaluate(diff: ReportDiff, slower_pct: float | None, thresholds: list[Threshold]) -> GateResult:
    """Check every threshold; the result lists each check and explains the verdict in one paragraph."""
    empty = [side for side, ref in (("base", diff.base), ("new", diff.new)) if ref.steps == 0]
    if empty:  # nothing measured on that side: no threshold can be checked, none can pass
        text = f"the {' and '.join(empty)} run{'s hold' if len(empty) > 1 else ' holds'} no step, so nothing can be compared"
        return GateResult(failed=True, checks=[text], explanation=f"No comparison: {text}; capture complete steps on both sides.")
    # Each check with what it checks (None: the step time), so the notes below can tell timing from memory.
    checks: list[tuple[bool, str, Threshold | None]] = []
    if slower_pct is not None:
        checks.append((*_step_time(diff, slower_pct), None))
    for threshold in thresholds:
        checks.append((*(_pp(diff, threshold) if threshold.unit == "pp" else _percent(diff, threshold)), threshold))
    failed = [text for bad, text, _ in checks if bad]
    if failed:
        explanation = "Regression: " + "; ".join(failed) + "."
    elif checks:
        explanation = "No regression beyond noise and the thresholds: " + "; ".join(text for _, text, _ in checks) + "."
    else:
        explanation = "No threshold was given: nothing to gate."
    busy = [side for side in ("base", "new") if any(w.startswith(f"the {side} run was captured on a busy machine") for w in diff.warnings)]
    timing = [text for bad, text, spec in checks if bad and not (spec is not None and spec.name.startswith("memory."))]
    if timing and busy:
        explanation += (f" Note: the {' and '.join(busy)} run{'s were' if len(busy) > 1 else ' was'} captured on a busy machine"
                        " (see the warnings): a timing regression may be the load; rerun both on an idle machine before trusting it.")
    if diff.step_time.method.startswith("too few steps"):
        explanation += f" Note: {diff.step_time.method}, so no change can be called beyond noise; profile more steps."
    return GateResult(failed=bool(failed), checks=[text for _, text, _ in checks], explanation=explanation)


def _step_time(diff: ReportDiff, limit: float) -> tuple[bool, str]:
    s = diff.step_time
    ci = f" (95 % CI {s.ci_low_pct:+.1f} to {s.ci_high_pct:+.1f} %)" if s.ci_low_pct is not None and s.ci_high_pct is not None else ""
    bad = s.significant and s.change_pct > limit
    state = "beyond noise" if s.significant else "within noise"
    return bad, f"step time {s.change_pct:+.1f} %{ci}, {state}, limit +{limit:g} %"


def _percent(diff: ReportDiff, threshold: Threshold) -> tuple[bool, str]:
    metric = _find_metric(diff, threshold.name)
    if metric.change_pct is None:
        return False, f"{metric.name}: not in both runs, not checked"
    worse_pct = metric.change_pct if metric.better != "higher" else -metric.change_pct
    bad = metric.significant and worse_pct > threshold.value
    state = "beyond noise" if metric.significant else "within noise"
    return bad, f"{metric.name} {metric.change_pct:+.1f} % ({'worse' if worse_pct > 0 else 'not worse'}, {state}), limit {threshold.value:g} % worse"


def _pp(diff: ReportDiff, threshold: Threshold) -> tuple[bool, str]:
    category = _find_category(diff, threshold.name)
    metric = next((m for m in diff.metrics if m.name == f"breakdown.{category.category}_us"), None)
    significant = metric.significant if metric is not None else False
    bad = significant and category.change_pp > threshold.value
    state = "beyond noise" if significant else "within noise"
    return bad, f"{category.category} share {category.base_percent:.1f} -> {category.new_percent:.1f} % ({category.change_pp:+.1f} pp, {state}), limit +{threshold.value:g} pp"


def _find_metric(diff: ReportDiff, name: str) -> MetricChange:
    for candidate in (name, f"breakdown.{name}_us", f"phases.{name}_us"):
        for metric in diff.metrics:
            if metric.name == candidate:
                return metric
    known = ", ".join(m.name for m in diff.metrics[:12])
    raise UsageError(f"no metric {name!r} in these reports (some are: {known})")


def _find_category(diff: ReportDiff, name: str) -> CategoryChange:
    short = name.removeprefix("breakdown.").removesuffix("_us")
    for category in diff.breakdown:
        if category.category == short:
            return category
    raise UsageError(f"no breakdown category {name!r} (these reports have: {', '.join(c.category for c in diff.breakdown)})")
