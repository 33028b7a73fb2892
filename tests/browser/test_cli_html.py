"""The CLI's two ways to a dashboard, end to end: `torchscope analyze PATH --format html -o report.html` and
`torchscope run` (a tiny real CPU training script) writing report.html into the run directory. Each writes
ONE file that names no external script, stylesheet or CDN, and that opens from file:// in headless Chromium
with every view drawn, no console error and no request leaving the file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from browser_env import TRACES, VIEWS, Page

from torchscope.rundir.layout import HTML_REPORT_NAME

TRAINING = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
# Any URL the page could fetch: a src/href/action/url() that is not a fragment, data: URI or the one
# Perfetto link (a plain <a> the user may click when online; it fetches nothing by itself).
_FETCHING = re.compile(r"""(?:\bsrc|\bhref|\baction|\bsrcset)\s*=\s*["']?(?!#|data:|https://ui\.perfetto\.dev/)[^\s"'>]+|url\(\s*["']?(?!#|data:)[^)'"]+|@import""", re.I)


def _assert_self_contained(html: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)
    assert not re.search(r"<link(?![^>]*href=['\"]?data:)[^>]*\bhref\s*=", html, re.I)
    assert _FETCHING.findall(html) == []
    assert not re.search(r"cdn|unpkg|jsdelivr|googleapis", html, re.I)


def _open_every_view(page: Page, report: Path) -> None:
    """Open `report` from file:// with every non-file request recorded and refused; draw each view."""
    tab, requests = page.page, []
    tab.route(re.compile(r"^(?!file:)"), lambda route: (requests.append(route.request.url), route.abort()))
    tab.goto(report.as_uri())
    tab.wait_for_selector("#view-overview.active")
    for view in VIEWS:
        tab.click(f"#ts-nav button[data-view={view}]")
        assert tab.locator(f"#view-{view} .card").count() >= 1, view
    assert requests == [] and page.errors == [] and page.dialogs == []


def test_analyze_format_html_writes_one_offline_file(page: Page, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "torchscope", "analyze", str(TRACES / "hta_two_ranks_nccl"),
                           "--format", "html", "-o", str(out / "report.html"), "--no-cache", "--jobs", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == ["report.html"]  # one file, nothing beside it
    html = (out / "report.html").read_text(encoding="utf-8")
    _assert_self_contained(html)
    _open_every_view(page, out / "report.html")
    assert "2" in page.page.locator("#view-overview").inner_text()  # drawn from the data, not an empty shell
    page.page.click("#ts-nav button[data-view=distributed]")
    assert page.page.locator("#view-distributed").inner_text().count("rank") >= 2


def test_run_writes_report_html_into_the_run_directory(page: Page, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAINING, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "torchscope", "run", "--out", "run", "--wait", "0", "--warmup", "1",
                           "--active", "3", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = tmp_path / "run" / HTML_REPORT_NAME
    assert report.is_file() and "run directory" in done.stderr
    html = report.read_text(encoding="utf-8")
    _assert_self_contained(html)
    _open_every_view(page, report)
    overview = page.page.locator("#view-overview").inner_text()
    assert "3" in overview and "cpu" in overview.lower()
