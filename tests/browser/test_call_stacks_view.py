"""The call stacks of the Operators view's call-site table (dashboard.js `stackCell`) in headless
Chromium, on a real CPU run where two callers reach one function (tests/helpers/two_callers.py): each
row's stack folds to its frame count, opens to the Report's frames in order, and says when other
callers share the site. With TORCHSCOPE_SCREENSHOTS=DIR it saves the card, one stack open."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from browser_env import Page

from helpers.two_callers import two_callers_run


@pytest.fixture(scope="module")
def two_callers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    out = two_callers_run(tmp_path_factory.mktemp("stacks") / "run")
    run = analyze_run(out, jobs=1, use_cache=False)
    page = out.parent / "stacks.html"
    page.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    return run.report, page


def test_the_operators_view_shows_the_call_stack_of_a_call_site(page: Page, two_callers: tuple[Any, Path]) -> None:
    report, html = two_callers
    [layer] = [r for r in report.call_sites if r.operator == "aten::addmm" and r.site.startswith("_layer (")]
    assert len(layer.stack) >= 2 and layer.stack_share < 1
    tab = page.page
    tab.goto(html.as_uri() + "#operators")
    tab.wait_for_selector("#view-operators.active")
    card = tab.locator("#view-operators .card", has_text="Where the top operators are called from")
    assert card.locator("th", has_text="call stack").count() == 1
    rows = card.locator("table.data tbody tr")
    assert rows.count() == len(report.call_sites)
    row = rows.filter(has=tab.locator("td:nth-child(1)", has_text="aten::addmm")).filter(
        has=tab.locator("td:nth-child(2)", has_text=layer.site))
    assert row.count() == 1
    details = row.locator("details.ts-stack")
    summary = details.locator("summary").inner_text()
    assert summary.startswith(f"{len(layer.stack)} frames") and "other callers" in summary
    assert not details.locator("li").first.is_visible()  # folded until opened
    details.locator("summary").click()
    assert details.locator("li").all_inner_texts() == layer.stack  # outermost first, as in the Report
    assert details.locator("li").first.is_visible()
    if shots := os.environ.get("TORCHSCOPE_SCREENSHOTS"):  # docs/screenshots/cpu-operators-call-stack.png
        Path(shots).mkdir(parents=True, exist_ok=True)
        card.screenshot(path=str(Path(shots) / "cpu-operators-call-stack.png"))
    filter_box = card.locator("input[type=search]")
    for caller in ("_train_step", "_evaluate"):  # the filter reaches the stacks' frames too
        filter_box.fill(caller)
        assert rows.count() == sum(any(caller in f for f in [r.operator, r.site, *r.stack]) for r in report.call_sites)
    assert page.errors == []
