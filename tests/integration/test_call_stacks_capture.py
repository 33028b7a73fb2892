"""Call stacks of the call-site rows on a real CPU capture with Python stacks (analysis/callsites.py):
`_train_step` (3 calls a step) and `_evaluate` (1) both reach aten::addmm through `_layer`
(tests/helpers/two_callers.py). The row for that site is one row, showing the train path and a share
under 1; every stack is the user's own frames, ends with its site, and a site's rows add up to at most
the operator's row."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.two_callers import two_callers_run

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_a_function_reached_from_two_callers_shows_the_costlier_stack(tmp_path: Path) -> None:
    import torchscope
    from torchscope.analysis.callsites import STACK_DEPTH

    report = torchscope.analyze(two_callers_run(tmp_path / "run"), jobs=1, use_cache=False)
    assert report.call_sites
    for row in report.call_sites:
        assert row.stack and row.stack[-1] == row.site and len(row.stack) <= STACK_DEPTH, row
        assert 0 < row.stack_share <= 1, row
        assert not any("site-packages" in f or f.startswith("torch") for f in row.stack), row
    [layer] = [r for r in report.call_sites if r.operator == "aten::addmm" and r.site.startswith("_layer (two_callers.py:")]
    assert layer.stack[-2].startswith("_train_step (two_callers.py:")  # 3 of every 4 calls come from training
    assert 0.5 < layer.stack_share < 0.99  # the evaluate path is the rest
    by_name = {op.name: op for op in report.operators}
    for name in {r.operator for r in report.call_sites}:
        sites = sum(r.host_self_us for r in report.call_sites if r.operator == name)
        assert sites <= by_name[name].host_self_us * (1 + 1e-9) + 1e-6, name
