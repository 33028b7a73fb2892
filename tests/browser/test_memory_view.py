"""The Memory view (render/assets/view_memory.js) in headless Chromium, on a real CPU run that keeps a
tensor every step: the allocated line, the peak marked at the Report's time with its operator, the
growth per step and the per-step rows, with no console error; and on synthetic CUDA `[memory]` events,
the reserved line drawn when they carry `Total Reserved` and absent when they do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_env import Page, screenshot

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
    screenshot(tab, "leaky-memory")


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


def _gpu_memory_page(folder: Path, reserved: bool) -> tuple[Any, Path]:
    """A synthetic CUDA trace (Kineto's `[memory]` events) of 4 steps that each allocate 8 MiB more and free
    it; the caching allocator's reserve grows in 20 MiB segments (to 40 MiB) and is never given back. With
    `reserved=False` the events carry no `Total Reserved`, as some PyTorch builds write them."""
    from helpers.trace_builder import HOST_PID, HOST_TID, TraceBuilder

    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    mib = 1 << 20
    b = TraceBuilder().gpu()
    allocated, segments = 0, 0
    for i in range(4):
        t0 = 100.0 + i * 1000.0
        b.step(i, t0, 990.0)
        b.op("aten::empty", t0 + 100, 50)
        b.launch(t0 + 200, 10, t0 + 220, 300)  # a kernel: a CUDA run, as the memory events say
        for delta, ts in (((i + 1) * 8 * mib, t0 + 110), (-(i + 1) * 8 * mib, t0 + 600)):
            allocated += delta
            segments = max(segments, -(-allocated // (20 * mib)))
            args = {"Addr": 5000 + i, "Bytes": delta, "Total Allocated": allocated, "Device Type": 1, "Device Id": 0}
            if reserved:
                args["Total Reserved"] = segments * 20 * mib
            b.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": HOST_PID, "tid": HOST_TID, "ts": ts, "args": args})
    trace = b.write(folder / "trace.json")
    run = analyze_run(trace, jobs=1, use_cache=False)
    page = folder / "gpu_memory.html"
    page.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    return run.report, page


def _ys(d: str) -> list[float]:
    return [float(p.split(",")[1]) for p in d.replace("M", "L").split("L") if p]


def test_the_reserved_line_is_drawn_when_memory_events_carry_total_reserved(page: Page, tmp_path: Path) -> None:
    report, html = _gpu_memory_page(tmp_path, reserved=True)
    reserved = report.memory.reserved_timeline["cuda:0"]
    assert max(v for _, v in reserved) == report.memory.peak_reserved_bytes["cuda:0"] == 40 << 20
    tab = page.page
    tab.goto(html.as_uri() + "#memory")
    tab.wait_for_selector("#view-memory.active")
    chart = tab.locator("#view-memory svg.ts-memory-chart[data-device='cuda:0']")
    assert chart.locator("path.reserved").count() == 1 and chart.locator("path.allocated").count() == 1
    drawn = chart.locator("path.reserved").get_attribute("d") or ""
    assert drawn.startswith("M") and drawn.count("L") == len(reserved) - 1
    # The reserve tops the chart (40 MiB, above the 32 MiB allocated peak) and never dips (never given back).
    ys, allocated_ys = _ys(drawn), _ys(chart.locator("path.allocated").get_attribute("d") or "")
    assert min(ys) < min(allocated_ys) and all(a >= b for a, b in zip(ys, ys[1:]))
    assert "reserved" in tab.locator("#view-memory .legend").first.inner_text()
    assert "peak reserved" in (text := tab.locator("#view-memory").inner_text())
    assert size(40 << 20).replace(" ", "") in text.replace(" ", "")
    assert page.errors == []
    screenshot(tab, "cuda-memory-reserved")


def test_no_reserved_line_without_total_reserved(page: Page, tmp_path: Path) -> None:
    report, html = _gpu_memory_page(tmp_path, reserved=False)
    assert "cuda:0" in report.memory.timeline and "cuda:0" not in report.memory.reserved_timeline
    tab = page.page
    tab.goto(html.as_uri() + "#memory")
    chart = tab.locator("#view-memory svg.ts-memory-chart[data-device='cuda:0']")
    assert chart.locator("path.allocated").count() == 1 and chart.locator("path.reserved").count() == 0
    assert page.errors == []


def test_memory_view_says_when_the_trace_misses_frees(page: Page, tmp_path: Path) -> None:
    """The committed FSDP2 capture (tests/data/captures/fsdp2_gloo_cpu): its growth is stated with why it is
    no leak evidence; the terminal's growth cell marks it too."""
    from rich.console import Console

    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html
    from torchscope.render.memory_terminal import memory_table

    capture = Path(__file__).resolve().parents[1] / "data" / "captures" / "fsdp2_gloo_cpu"
    run = analyze_run(capture, jobs=1, use_cache=False)
    fit = run.report.memory.growth["cpu"]
    html = tmp_path / "fsdp.html"
    html.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    tab = page.page
    tab.goto(html.as_uri() + "#memory")
    tab.wait_for_selector("#view-memory.active")
    note = tab.locator("#view-memory p.ts-unrecorded-frees").inner_text()
    assert note.startswith(f"The trace misses frees here: {fit.unrecorded_frees} block(s) were allocated again")
    assert "(the line a leak is judged on)" in note and page.errors == []
    console = Console(width=200, record=True)
    console.print(memory_table(run.report.memory))
    assert "without blocks maybe freed unseen" in console.export_text()
