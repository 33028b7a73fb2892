"""The Modules view (render/assets/view_modules.js) in headless Chromium, on a real CPU run with stacks:
one row per module path of the Report, the call sites of the top operators, no console error; and a
trace without stacks says why the view is empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_env import Page


@pytest.fixture(scope="module")
def with_modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    import torch

    import torchscope
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    out = tmp_path_factory.mktemp("modules") / "run"
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.profile(out=out, wait=0, warmup=1, active=3, profile_memory=False) as prof:
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            optimizer.step()
            prof.step()
    run = analyze_run(out, jobs=1, use_cache=False)
    page = out.parent / "modules.html"
    page.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    return run.report, page


def test_modules_view_lists_every_module_path_and_the_call_sites(page: Page, with_modules: tuple[Any, Path]) -> None:
    report, html = with_modules
    assert len(report.modules) == 4 and report.call_sites
    tab = page.page
    tab.goto(html.as_uri() + "#modules")
    tab.wait_for_selector("#view-modules.active")
    rows = tab.locator("#view-modules .ts-modules tbody tr")
    assert rows.count() == len(report.modules)
    assert (rows.first.locator("td").first.text_content() or "") == report.modules[0].path  # largest host time first
    assert tab.locator("#view-modules .ts-call-sites tbody tr").count() == len(report.call_sites)
    assert page.errors == []


@pytest.mark.parametrize("name", ["resnet50", "empty"])
def test_modules_view_without_stacks_says_why(page: Page, reports: dict[str, Path], name: str) -> None:
    tab = page.page
    tab.goto(reports[name].as_uri() + "#modules")
    tab.wait_for_selector("#view-modules.active")
    assert "with_stack=True" in tab.locator("#view-modules").inner_text()
    assert tab.locator("#view-modules .ts-modules").count() == 0
    assert page.errors == []
