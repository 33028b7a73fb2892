"""The HTML dashboard on a large trace: analysis time, page size, and in headless Chromium the first paint,
the Timeline view's first draw and one zoom. Not a timed test: run by hand, figures in docs/performance.md.

    python benchmarks/generate.py --case 500mb
    python benchmarks/dashboard.py benchmarks/data/500mb [--jobs 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "browser"))  # the Chromium flags of the browser tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.html import render_html

    started = time.perf_counter()
    run = analyze_run(args.path, jobs=args.jobs)
    analysed = time.perf_counter() - started
    started = time.perf_counter()
    page = render_html(run.report, run.sidecars)
    rendered = time.perf_counter() - started
    out = Path(tempfile.mkdtemp()) / "report.html"
    out.write_text(page, encoding="utf-8")
    timeline = run.sidecars.get("timeline")
    print(f"analysis (jobs={args.jobs}, caches as found): {analysed:.1f} s; render: {rendered:.2f} s")
    print(f"page: {out.stat().st_size / 1e6:.1f} MB; timeline events {timeline.shown} of {timeline.events} drawn")
    for name, value in browser_figures(out).items():
        print(f"{name}: {value:.0f} ms")
    return 0


def browser_figures(page: Path) -> dict[str, float]:
    """Milliseconds from navigation to the first paint and to the overview drawn; the timeline's first
    draw and one zoom, measured in the page (both draw synchronously in their click handlers)."""
    from browser_env import CHROMIUM, CHROMIUM_FLAGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        tab = browser.new_page(viewport={"width": 1300, "height": 900})
        started = time.perf_counter()
        tab.goto(page.as_uri())
        tab.wait_for_selector("#view-overview.active")
        loaded = (time.perf_counter() - started) * 1000
        paint = tab.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? -1")
        draw = tab.evaluate(
            "(() => { const t = performance.now(); document.querySelector('[data-view=timeline]').click();"
            " return performance.now() - t; })()"
        )
        zoom = tab.evaluate(
            "(() => { const t = performance.now(); document.getElementById('ts-zoom-in').click();"
            " return performance.now() - t; })()"
        )
        browser.close()
    return {"first contentful paint": paint, "overview shown (wall, incl. load)": loaded,
            "timeline first draw": draw, "zoom redraw": zoom}


if __name__ == "__main__":
    raise SystemExit(main())
