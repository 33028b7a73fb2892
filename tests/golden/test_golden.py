"""Every report on every real trace is the one recorded in tests/golden (see golden.py): a redesign of the
pipeline must not change a figure. The committed cuts under tests/data/traces always run; the full
traces in ../shared/traces run when that folder is present."""

from __future__ import annotations

import gzip
import json

import pytest

from golden.golden import NEW_IN_V2, RENAMED_IN_V2, SOURCES, differences, golden_path, inputs, normalised, report_json


def _check(source: str) -> list[str]:
    root = SOURCES[source]
    problems = []
    for name, path in inputs(source):
        expected = json.loads(gzip.decompress(golden_path(source, name).read_bytes()))
        actual = normalised(report_json(path), root, drop=NEW_IN_V2 + RENAMED_IN_V2)
        expected = {k: v for k, v in expected.items() if k not in RENAMED_IN_V2}
        problems += [f"{name}: {d}" for d in differences(expected, actual)]
    return problems


def test_reports_on_committed_traces_match_golden() -> None:
    problems = _check("data")
    assert not problems, "\n".join(problems[:40])


def test_reports_on_shared_traces_match_golden(shared_traces: object) -> None:
    problems = _check("shared")
    assert not problems, "\n".join(problems[:40])
