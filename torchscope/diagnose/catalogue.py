"""The rule catalogue as a Markdown table, from the declarations (docs/rules.md embeds it; a test
keeps the two equal, so the documented thresholds and fixes are the ones the code applies)."""

from __future__ import annotations

from torchscope.diagnose.engine import RULES, VERDICTS
from torchscope.diagnose.rule import Rule, Severities
from torchscope.report.model import Fix

HEADER = (
    "| finding id | category | threshold (source) | severity | fixes (kind: target = value) |\n"
    "|---|---|---|---|---|"
)


def markdown_table() -> str:
    """One row per declared rule, in registry order (verdicts last)."""
    return "\n".join([HEADER, *(_row(r) for r in RULES + VERDICTS)])


def _row(rule: Rule) -> str:
    fixes = "<br>".join(_fix(f) for f in rule.fixes) or "none (see the recommendation)"
    return f"| `{rule.id}` | {rule.category} | {rule.threshold.source} | {_severity(rule.severity)} | {fixes} |"


def _severity(severities: Severities) -> str:
    parts: list[str] = [severities.base]
    if severities.warning_from is not None:
        parts.append(f"warning from {_percent(severities.warning_from)}")
    if severities.critical_from is not None:
        parts.append(f"critical from {_percent(severities.critical_from)}")
    return ", ".join(parts)


def _percent(share: float) -> str:
    return f"{100 * share:g} %"


def _fix(fix: Fix) -> str:
    if fix.value is None:
        value = "(computed per run)"
    else:  # strings as written in code, other values as Python literals (True, 2)
        value = f"`{fix.value}`" if isinstance(fix.value, str) else f"`{fix.value!r}`"
    return f"{fix.kind}: `{fix.target}` = {value}"


if __name__ == "__main__":  # python -m torchscope.diagnose.catalogue: the table for docs/rules.md
    print(markdown_table())
