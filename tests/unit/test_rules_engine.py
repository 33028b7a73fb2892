"""The rule registry and the engine: every declared rule is unique, categorised, documented and
registered; verdicts become findings (severity, rounding, fixes); findings are ranked by cost."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import get_args

import pytest

from test_rules_support import findings, report
from torchscope.diagnose import engine
from torchscope.diagnose.catalogue import markdown_table
from torchscope.diagnose.rule import INFO, Rule, Severities, Threshold, Verdict, by_share, rule
from torchscope.report.measurements import DataLoader, Measurements, Optimizer
from torchscope.report.model import Category, Finding, Fix, FixKind, Severity

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "rules.md").read_text()
ALL = engine.RULES + engine.VERDICTS


def test_rule_ids_are_unique_and_named_after_their_category() -> None:
    ids = [r.id for r in ALL]
    assert len(ids) == len(set(ids))
    for r in ALL:
        assert r.category in get_args(Category), r.id
        assert r.id.startswith(r.category + "."), r.id


def test_every_declared_rule_is_registered() -> None:
    """A rule declared in a rules module but missing from engine.RULES/VERDICTS would never run."""
    sources = "\n".join(p.read_text() for p in (REPO / "torchscope" / "diagnose").glob("rules_*.py"))
    declared = set(re.findall(r'@rule\(\s*"([^"]+)"', sources))
    assert declared == {r.id for r in ALL}
    assert len(ALL) >= 20


def test_every_rule_has_a_documented_threshold() -> None:
    for r in ALL:
        assert isinstance(r.threshold, Threshold) and math.isfinite(r.threshold.value), r.id
        assert len(r.threshold.source) > 10, r.id
        assert f"`{r.id}`" in DOCS.split("<!-- catalogue:begin -->")[0], f"{r.id} missing from the signals table"


def test_fixes_are_well_formed() -> None:
    for r in ALL:
        targets = [f.target for f in r.fixes]
        assert len(targets) == len(set(targets)), r.id
        for fix in r.fixes:
            assert fix.kind in get_args(FixKind) and fix.target and fix.summary, (r.id, fix)


def test_docs_catalogue_is_generated_from_the_declarations() -> None:
    between = DOCS.split("<!-- catalogue:begin -->\n")[1].split("\n<!-- catalogue:end -->")[0]
    assert between == markdown_table(), "regenerate with: python -m torchscope.diagnose.catalogue"


def _rule(verdict: Verdict, severity: Severities = INFO) -> Rule:
    fixes = (Fix(kind="env_var", target="A", value="1"), Fix(kind="env_var", target="B"))
    declare = rule("compute.toy", "compute", Threshold(0.1, "toy"), fixes=fixes, severity=severity)
    return declare(lambda ctx: verdict)


def test_finding_from_verdict_rounds_and_fills_fixes() -> None:
    verdict = Verdict(
        title="t",
        share=0.123456,
        evidence={"x": 1.23456, "big": 1234567.8, "bad": float("nan"), "nested": {"y": [0.00012345]}},
        recommendation="r",
        fix_values={"B": 4},
    )
    f = engine.make_finding(_rule(verdict, severity=by_share(0.1)), verdict)
    assert (f.id, f.category, f.severity, f.time_share) == ("compute.toy", "compute", "warning", 0.1235)
    assert f.evidence == {"x": 1.235, "big": 1234568, "bad": None, "nested": {"y": [0.0]}}
    assert [(x.target, x.value) for x in f.fixes] == [("A", "1"), ("B", 4)]


def test_verdict_can_keep_a_subset_of_fixes_and_names_only_declared_targets() -> None:
    keep_b = Verdict(title="t", share=None, evidence={}, recommendation="r", fix_targets=("B",))
    assert [x.target for x in engine.make_finding(_rule(keep_b), keep_b).fixes] == ["B"]
    typo = Verdict(title="t", share=None, evidence={}, recommendation="r", fix_values={"C": 1})
    with pytest.raises(ValueError, match="target"):
        engine.make_finding(_rule(typo), typo)


def test_severity_grading() -> None:
    graded = by_share(0.05)
    assert [graded.of(s) for s in (None, 0.0, 0.049, 0.05, 0.299, 0.3)] == ["info", "info", "info", "warning", "warning", "critical"]
    assert by_share(0.02, critical_from=None).of(0.9) == "warning"
    assert INFO.of(1.0) == "info"


def test_findings_are_ranked_by_time_share_then_severity_then_id() -> None:
    def f(fid: str, share: float | None, severity: Severity = "info") -> Finding:
        return Finding(id=fid, category="compute", severity=severity, title="", evidence={}, time_share=share, recommendation="")

    ranked = engine.rank([f("z", None), f("b", 0.1), f("a", 0.1), f("c", 0.1, "warning"), f("d", 0.5), f("y", None, "warning")])
    assert [x.id for x in ranked] == ["d", "c", "a", "b", "y", "z"]


def test_diagnose_ranks_findings_of_a_hand_built_report() -> None:
    measurements = Measurements(
        dataloader=DataLoader(single_process_fetches=4),
        optimizer=Optimizer(zero_grad_fill_ops_per_step=10, zero_grad_us_per_step=200),
    )
    ranked = engine.diagnose(report(measurements=measurements, breakdown={"data_loading": 0.4}))
    assert [x.id for x in ranked] == ["data_loading.exposed", "optimizer.zero_grad_fill"]
    assert [x.severity for x in ranked] == ["critical", "info"]


def test_a_healthy_report_has_no_findings() -> None:
    assert findings(report()) == {}
