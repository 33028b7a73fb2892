"""The HTML dashboard in headless Chromium: every view of every sample renders with no console error,
tables sort and filter, the timeline zooms, pans and shows an event's details, and hostile user text
stays text. Set TORCHSCOPE_SCREENSHOTS=DIR to also save a PNG of each view (docs/screenshots/)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from browser_env import HOSTILE_LABEL, VIEWS, Page

SAMPLES = ("cpu", "resnet50", "two_ranks")


def _open(page: Page, report: Path, view: str = "overview") -> Any:
    page.page.goto(report.as_uri() + "#" + view)
    page.page.wait_for_selector(f"#view-{view}.active")
    return page.page


@pytest.mark.parametrize("sample", [*SAMPLES, "empty"])
def test_every_view_renders_without_console_errors(page: Page, reports: dict[str, Path], sample: str) -> None:
    tab = _open(page, reports[sample])
    shots = os.environ.get("TORCHSCOPE_SCREENSHOTS")
    for view in VIEWS:
        tab.click(f"#ts-nav button[data-view={view}]")
        section = tab.locator(f"#view-{view}")
        assert section.is_visible(), view
        assert section.locator(".card").count() >= 1, view
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(Path(shots) / f"{sample}-{view}.png"))
    assert page.errors == []


def _column(tab: Any, table: Any, index: int) -> list[str]:
    return [str(t) for t in table.locator(f"tbody tr td:nth-child({index})").all_inner_texts()]


@pytest.mark.parametrize("view", ["operators", "kernels"])
def test_sorting_and_filtering_change_the_rows(page: Page, reports: dict[str, Path], view: str) -> None:
    tab = _open(page, reports["resnet50"], view)
    table = tab.locator(f"#view-{view} table.data").last
    names = _column(tab, table, 1)
    assert len(names) > 3
    table.locator("th", has_text="calls").first.click()
    by_calls = _column(tab, table, 1)
    assert by_calls != names
    table.locator("th", has_text="calls").first.click()  # again: the other direction
    assert _column(tab, table, 1) != by_calls
    search = tab.locator(f"#view-{view} input[type=search]").last
    search.fill(names[0][:12])
    filtered = _column(tab, table, 1)
    assert 1 <= len(filtered) < len(names) and all(names[0][:12].lower() in n.lower() for n in filtered)
    search.fill("no operator is called this")
    assert _column(tab, table, 1) == []
    assert page.errors == []


def test_operators_group_by_shape(page: Page, reports: dict[str, Path]) -> None:
    tab = _open(page, reports["cpu"], "operators")
    tab.select_option("#view-operators select", "shape")
    assert tab.locator("#view-operators table.data th", has_text="input shapes").count() == 1
    assert page.errors == []


def _range(tab: Any) -> tuple[float, float]:
    canvas = tab.locator("#ts-timeline")
    return float(canvas.get_attribute("data-start")), float(canvas.get_attribute("data-end"))


def _click_an_event(tab: Any, canvas: Any) -> None:
    """Click along the first host lane's top rows until an event is hit (where events are varies)."""
    for y in (24, 38, 52):
        for x in range(250, 1250, 25):
            canvas.click(position={"x": x, "y": y})
            if tab.locator("#ts-details").inner_text().startswith("name: "):
                return


@pytest.mark.parametrize("sample", SAMPLES)
def test_timeline_zooms_pans_and_shows_event_details(page: Page, reports: dict[str, Path], sample: str) -> None:
    tab = _open(page, reports[sample], "timeline")
    start, end = _range(tab)
    canvas = tab.locator("#ts-timeline")
    _click_an_event(tab, canvas)
    assert tab.locator("#ts-details").inner_text().startswith("name: ")
    tab.click("#ts-zoom-in")
    zoomed = _range(tab)
    assert zoomed[1] - zoomed[0] == pytest.approx((end - start) / 2)
    tab.click("#ts-pan-right")
    panned = _range(tab)
    assert panned[0] > zoomed[0] and panned[1] - panned[0] == pytest.approx(zoomed[1] - zoomed[0])
    box = canvas.bounding_box()
    tab.mouse.move(box["x"] + 500, box["y"] + 40)
    tab.mouse.wheel(0, -300)
    wheeled = _range(tab)
    assert wheeled[1] - wheeled[0] < panned[1] - panned[0]
    tab.mouse.down()
    tab.mouse.move(box["x"] + 300, box["y"] + 40, steps=4)
    tab.mouse.up()
    dragged = _range(tab)
    assert dragged[0] > wheeled[0]
    assert page.errors == []


def test_a_hostile_label_shows_as_text_and_runs_nothing(page: Page, reports: dict[str, Path]) -> None:
    raw = reports["cpu"].read_text(encoding="utf-8")
    assert HOSTILE_LABEL not in raw and "<img" not in raw  # embedded escaped, as \u003c...
    tab = _open(page, reports["cpu"], "operators")
    assert tab.locator("#view-operators").get_by_text(HOSTILE_LABEL, exact=True).count() >= 1
    _open(page, reports["cpu"], "timeline")
    assert tab.evaluate("document.querySelectorAll('img').length") == 0
    assert page.dialogs == [] and page.errors == []


@pytest.mark.parametrize("sample", ["resnet50", "two_ranks"])
def test_clicking_a_kernel_shows_the_runtime_call_that_launched_it(page: Page, reports: dict[str, Path], sample: str) -> None:
    tab = _open(page, reports[sample], "timeline")
    canvas = tab.locator("#ts-timeline")
    tops = [entry.split(":") for entry in str(canvas.get_attribute("data-lanes")).split(",")]
    device_y = next(int(float(y)) for kind, y in tops if kind == "device") + 6
    for x in range(250, 1250, 10):
        canvas.click(position={"x": x, "y": device_y})
        if "launched by: " in tab.locator("#ts-details").inner_text():
            break
    details = tab.locator("#ts-details").inner_text()
    assert "launched by: cuda" in details
    # The device event's args (analysis/timeline.py): a kernel's launch figures, a copy's size and rate.
    assert ("grid: [" in details and "blocks per SM: " in details) or ("bytes: " in details and "memory bandwidth (GB/s): " in details)
    assert page.errors == []


def _si_rate(value: float) -> str:
    prefixes, i = ["", "K", "M", "G", "T", "P"], 0
    while abs(value) >= 1000 and i < len(prefixes) - 1:
        value, i = value / 1000, i + 1
    return f"{value:.2f} {prefixes[i]}FLOP/s"


def test_operators_show_achieved_flops_where_known(page: Page, reports: dict[str, Path], cpu_run: Path) -> None:
    import torchscope

    report = torchscope.analyze(cpu_run, jobs=1, use_cache=False)
    known = {r.name: r.achieved_flops_per_s for r in report.operators if r.achieved_flops_per_s is not None}
    unknown = [r.name for r in report.operators if r.flops is None]
    assert known and unknown  # the linear layers' matmuls have FLOPs from their shapes; relu has none
    tab = _open(page, reports["cpu"], "operators")
    table = tab.locator("#view-operators table.data").first
    headers = [str(t) for t in table.locator("thead th").all_inner_texts()]
    column = next(i for i, h in enumerate(headers, start=1) if h.startswith("FLOP/s"))
    names, rates = _column(tab, table, 1), _column(tab, table, column)
    shown = dict(zip(names, rates))
    for name, rate in known.items():
        if name in shown:
            assert shown[name] == _si_rate(rate), name
    assert any(name in shown for name in known)
    assert all(shown[name] == "-" for name in unknown if name in shown)
    assert page.errors == []


def test_operators_view_shows_call_sites_and_modules_of_a_run_with_stacks(page: Page, reports: dict[str, Path], cpu_run: Path) -> None:
    import torchscope

    report = torchscope.analyze(cpu_run, jobs=1, use_cache=False)
    assert report.call_sites and report.modules  # torchscope.profile records stacks and module events
    tab = _open(page, reports["cpu"], "operators")
    sites = tab.locator("#view-operators .card", has_text="Where the top operators are called from").locator("table.data")
    shown_sites = set(_column(tab, sites, 2))
    assert shown_sites == {row.site for row in report.call_sites}
    assert all("(" in site and ":" in site for site in shown_sites)  # "func (file.py:42)"
    modules = tab.locator("#view-operators .card", has_text="Modules (nn.Module forward").locator("table.data")
    assert set(_column(tab, modules, 1)) == {row.path for row in report.modules}
    assert "Linear" in _column(tab, modules, 2)
    assert page.errors == []
