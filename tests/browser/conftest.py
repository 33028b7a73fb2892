"""Browser fixtures: Debian's Chromium driven by Playwright for Python (never a downloaded browser), and
the dashboards under test rendered from real runs: a small CPU training run made here (with a hostile
`record_function` label), the ResNet-50 GPU cut and the 2-rank NCCL cut committed under tests/data.

These tests are required: without /usr/bin/chromium or playwright they fail, with the fix in the message
(.ci/run installs Chromium; `pip install -e '.[test]'` installs playwright)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from browser_env import CHROMIUM, CHROMIUM_FLAGS, HOSTILE_LABEL, TRACES, Page


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (.ci/run does this)", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[test]'", pytrace=False)
    with sync_playwright() as play:
        launched = play.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    tab = context.new_page()
    watched = Page(tab)
    tab.on("console", lambda m: watched.errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: watched.errors.append(str(e)))
    tab.on("dialog", lambda d: (watched.dialogs.append(d.message), d.dismiss()))
    yield watched
    context.close()


def _render(path: Path | list[Path], out: Path) -> Path:
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    run = analyze_run(path, jobs=1, use_cache=False)
    out.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    return out


def cpu_training_run(out: Path) -> Path:
    """A small real CPU training run profiled with torchscope.profile, one range named HOSTILE_LABEL."""
    import torch

    import torchscope

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.profile(out=out) as prof:
        for _ in range(6):
            with torch.profiler.record_function(HOSTILE_LABEL):
                x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    return out


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cpu_training_run(tmp_path_factory.mktemp("cpu") / "run")


@pytest.fixture(scope="session")
def reports(tmp_path_factory: pytest.TempPathFactory, cpu_run: Path) -> dict[str, Path]:
    """The dashboards under test, by name, rendered once per session."""
    folder = tmp_path_factory.mktemp("html")
    return {
        "cpu": _render(cpu_run, folder / "cpu.html"),
        "resnet50": _render(TRACES / "resnet50_num_workers_0", folder / "resnet50.html"),
        "two_ranks": _render(TRACES / "hta_two_ranks_nccl", folder / "two_ranks.html"),
        "empty": _empty(folder / "empty.html"),
    }


def _empty(out: Path) -> Path:
    """A Report with nothing in it (no steps, no timeline): the page must still draw every view."""
    from torchscope.render.html import render_html
    from torchscope.report.model import Report, RunInfo

    report = Report(torchscope_version="0", run=RunInfo(paths=[], trace_files=[], ranks=[], device_kind="cpu"),
                    steps=[], breakdown={})
    out.write_text(render_html(report), encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A logdir of two runs (copies of the committed cuts) and a folder outside it, linked from inside."""
    root = tmp_path_factory.mktemp("logdir")
    for name in ("resnet50_num_workers_0", "hta_two_ranks_nccl"):
        shutil.copytree(TRACES / name, root / "runs" / name)
    outside = root / "outside"
    shutil.copytree(TRACES / "tb_unit", outside)
    (root / "runs" / "escape").symlink_to(outside, target_is_directory=True)
    return root / "runs"
