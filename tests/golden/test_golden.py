"""Every report on every real trace is the one recorded in tests/golden (see golden.py): a redesign of the
pipeline must not change a figure. Fields added after a golden file was recorded are not compared; a
deliberate change of figures is recorded by rewriting the golden files (`python tests/golden/golden.py`)
in the commit that makes it, which says why. The committed cuts under tests/data/traces always run; the full
traces in ../shared/traces run when that folder is present."""

from __future__ import annotations

import gzip
import json
from typing import Any

from golden.golden import SOURCES, differences, golden_path, inputs, normalised, report_json


def legacy_signals(measurements: dict[str, Any], v1: dict[str, Any]) -> dict[str, Any]:
    """Version 2 `measurements` in version 1's `signals` layout, for the figures version 1 had.

    Left out on purpose: `step_numbers` (the steps are in `report.steps`), and the DataLoader fetch
    counts, which version 1 averaged over spans and version 2 adds up (test_pipeline.py checks the sum)."""
    signals = {k: measurements[k] for k in ("sync", "copies", "optimizer", "compile")}
    for section in ("launch", "dispatch"):  # version 1 left these out, as `{}`, where they do not apply
        if v1.get(section):
            signals[section] = measurements[section]
    signals["outside_steps"] = measurements["outside_steps"]["culprits_us_per_step"]
    signals["idle_host_ops"] = measurements["idle"]["host_ops_us_per_step"]
    signals["idle_us_per_step"] = measurements["idle"]["idle_us_per_step"]
    signals["idle_explained_us_per_step"] = measurements["idle"]["explained_us_per_step"]
    return signals


def _check(source: str) -> list[str]:
    root = SOURCES[source]
    problems = []
    for name, path in inputs(source):
        expected = json.loads(gzip.decompress(golden_path(source, name).read_bytes()))
        report = report_json(path)
        actual = _as_recorded(normalised(report, root), expected)
        if "signals" in expected:  # recorded by version 1: its `signals` are version 2's `measurements`
            v1 = {k: v for k, v in expected.pop("signals").items() if k not in ("step_numbers", "dataloader")}
            v1 = {k: v for k, v in v1.items() if k not in ("launch", "dispatch") or v}
            problems += [f"{name}: {d}" for d in differences(v1, legacy_signals(report["measurements"], v1), "$.signals")]
        problems += [f"{name}: {d}" for d in differences(expected, actual)]
    return problems


def _as_recorded(actual: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """`actual` without the fields added since the golden file was recorded (top level and findings)."""
    out = {k: v for k, v in actual.items() if k in expected}
    finding_keys = {k for f in expected.get("findings", []) for k in f}
    if finding_keys:
        out["findings"] = [{k: v for k, v in f.items() if k in finding_keys} for f in out.get("findings", [])]
    return out


def test_reports_on_committed_traces_match_golden() -> None:
    problems = _check("data")
    assert not problems, "\n".join(problems[:40])


def test_reports_on_shared_traces_match_golden(shared_traces: object) -> None:
    problems = _check("shared")
    assert not problems, "\n".join(problems[:40])
