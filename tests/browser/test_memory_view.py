"""The Memory view (render/assets/view_memory.js) in headless Chromium, on a real CPU run that keeps a
tensor every step: the allocated line, the peak marked at the Report's time with its operator, the
growth per step and the per-step rows, with no console error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_env import Page

from torchscope.render.memory_terminal import size


@pytest.fixture(scope="module")
def leaky(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    import torch

    import torchscope
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    out = tmp_path_factory.mktemp("leaky") / "run"
    model = torch.nn.Linear(32, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with torchscope.profile(out=out, wait=0, warmup=1, active=5) as prof:
        for _ in range(7):
            loss = model(torch.randn(16, 32)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            kept.append(torch.ones(256, 1024))  # 1 MiB kept per step
            prof.step()
    run = analyze_run(out, jobs=1, use_cache=False)
    page = out.parent / "leaky.html"
    page.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    return run.report, page


def test_memory_view_draws_lines_peak_growth_and_steps(page: Page, leaky: tuple[Any, Path]) -> None:
    report, html = leaky
    tab = page.page
    tab.goto(html.as_uri() + "#memory")
    tab.wait_for_selector("#view-memory.active")
    chart = tab.locator("#view-memory svg.ts-memory-chart[data-device=cpu]")
    assert chart.locator("path.allocated").count() == 1
    path = chart.locator("path.allocated").get_attribute("d") or ""
    assert path.startswith("M") and path.count("L") == len(report.memory.timeline["cpu"]) - 1
    peak = report.memory.peaks["cpu"]
    marker = chart.locator("line.peak")
    assert float(marker.get_attribute("data-t-us") or "nan") == pytest.approx(peak.t_us)
    assert peak.operator and peak.operator in (chart.locator("text.peak-label").text_content() or "")
    text = tab.locator("#view-memory").inner_text()
    assert size(report.memory.growth["cpu"].bytes_per_step).replace(" ", "") in text.replace(" ", "")
    rows = [r for r in report.memory.per_step if r.device == "cpu"]
    assert tab.locator("#view-memory table.ts-memory-steps tbody tr").count() == len(rows) == 5
    assert page.errors == []


def test_peak_to_timeline_and_back_to_memory_at_the_same_time(page: Page, leaky: tuple[Any, Path]) -> None:
    """The peak's button opens the timeline at the peak (a cursor line); a click there at that line and
    "See memory at this time" come back to the memory chart marked at the peak's time."""
    report, html = leaky
    peak = report.memory.peaks["cpu"]
    tab = page.page
    tab.goto(html.as_uri() + "#memory")
    tab.locator("#view-memory button.ts-peak-to-timeline").first.click()
    tab.wait_for_selector("#view-timeline.active")
    assert tab.evaluate("location.hash").startswith("#timeline@0@")
    canvas = tab.locator("#ts-timeline")
    data = canvas.evaluate("c => [Number(c.dataset.cursor), Number(c.dataset.start), Number(c.dataset.end), c.clientWidth, c.height]")
    cursor, start, end, width, height = data
    assert start < cursor < end
    x = 190 + (cursor - start) / (end - start) * (width - 190)  # LABEL = 190 px of lane names
    canvas.click(position={"x": x, "y": height - 2})  # below the last lane: no event, the time itself
    tab.locator("#ts-to-memory").click()
    tab.wait_for_selector("#view-memory.active")
    chart = tab.locator("#view-memory svg.ts-memory-chart[data-device=cpu]")
    marked = float(chart.get_attribute("data-cursor-t-us") or "nan")
    pixel_us = (end - start) / (width - 190)
    assert marked == pytest.approx(peak.t_us, abs=2 * pixel_us + 1)
    assert chart.locator("line.cursor").count() == 1
    assert page.errors == []
