"""The Distributed view (render/assets/view_distributed.js) in headless Chromium: on the committed 2-rank
NCCL cut (ranks side by side, heat map, collectives, the straggler's card), and on a synthetic 1,024-rank
section (one heat-map cell per rank and metric, the extremes and the highest ranks named), with no
console error."""

from __future__ import annotations

from pathlib import Path

from browser_env import TRACES, Page

from torchscope.analysis.collective_match import collective_table
from torchscope.analysis.collectives import RankCollectives
from torchscope.analysis.distributed import summarise
from torchscope.pipeline.analyze import analyze
from torchscope.render.html import render_html
from torchscope.report.model import Report, RunInfo


def test_two_nccl_ranks(page: Page, tmp_path: Path) -> None:
    report = analyze(TRACES / "hta_two_ranks_nccl")
    html = tmp_path / "two.html"
    html.write_text(render_html(report), encoding="utf-8")
    tab = page.page
    tab.goto(html.as_uri() + "#distributed")
    tab.wait_for_selector("#view-distributed.active")
    view = tab.locator("#view-distributed")
    text = view.inner_text()
    assert "Collectives across ranks" in text and "send_recv" in text and "Ranks side by side" in text
    assert view.locator("svg.ts-heat").count() >= 5
    assert view.locator("svg.ts-heat").first.locator("rect").count() == 2
    if report.distributed.straggler is not None:
        assert f"Why rank {report.distributed.straggler.rank} is late" in text
    # compute / non-compute per rank side by side, and the overlap per step, as the Report holds them
    side = view.locator("div.card", has_text="Ranks side by side").inner_text()
    overlap = view.locator("div.card", has_text="overlapped by compute, per step").inner_text()
    for row in report.distributed.ranks:
        assert row.compute_pct is not None and row.non_compute_pct is not None and row.overlap_pct_by_step
        assert f"{row.compute_pct:.1f} %" in side and f"{row.non_compute_pct:.1f} %" in side
        for step, pct in row.overlap_pct_by_step.items():
            assert f"step {step}" in overlap and f"{pct:.1f} %" in overlap
    assert page.errors == []


def _rank(late_us: float) -> RankCollectives:
    steps = list(range(4))
    return RankCollectives(
        source="kernel", names=["all_reduce"], groups=["0"], name_id=[0] * 4, group_id=[0] * 4, step=steps,
        ordinal=[0] * 4, seq=[-1] * 4, start_us=[10_000.0 * s + late_us for s in steps], dur_us=[6000.0 - late_us] * 4,
        compute_overlap_us=[0.0] * 4, nelems=[1] * 4, step_numbers=steps, step_us=[10_000.0] * 4,
        phase_us={"forward": [3000.0 + late_us] * 4}, culprits_us={},
    )


def test_thousand_ranks_heat_map(page: Page, tmp_path: Path) -> None:
    ranks = list(range(1024))
    extracts = [[_rank(5000.0 if r == 777 else 0.0)] for r in ranks]
    section = summarise(ranks, extracts, collective_table(ranks, extracts))
    report = Report(torchscope_version="test", run=RunInfo(paths=[], trace_files=[], ranks=ranks, device_kind="cuda"),
                    steps=[], breakdown={}, distributed=section)
    html = tmp_path / "many.html"
    html.write_text(render_html(report), encoding="utf-8")
    tab = page.page
    tab.goto(html.as_uri() + "#distributed")
    tab.wait_for_selector("#view-distributed.active")
    view = tab.locator("#view-distributed")
    late = view.locator("div.ts-heat-row", has_text="late by")
    assert late.locator("rect").count() == 1024
    assert "highest: rank 777" in late.inner_text()
    assert "Why rank 777 is late" in view.inner_text()
    assert page.errors == []


def test_timeline_says_which_rank_was_shifted(page: Page, tmp_path: Path) -> None:
    """Two synthetic ranks whose clocks differ by 5 ms: the Timeline view states the shift it applied."""
    from helpers.trace_builder import TraceBuilder

    from torchscope.pipeline.analyze import analyze_run

    for rank, compute, skew in ((0, 10_000.0, 0.0), (1, 40_000.0, 5_000.0)):
        trace = TraceBuilder().rank(rank, 2)
        for step in range(3):
            t0 = step * 100_000.0 + skew
            trace.step(step, t0, 60_000.0)
            trace.op("aten::mm", t0 + 1_000.0, compute)
            trace.annotation("gloo:all_reduce", t0 + 1_000.0 + compute, 49_000.0 - compute)
        trace.write(tmp_path / f"rank{rank}.json")
    run = analyze_run(tmp_path, jobs=1, use_cache=False)
    html = tmp_path / "aligned.html"
    html.write_text(render_html(run.report, run.sidecars), encoding="utf-8")
    tab = page.page
    tab.goto(html.as_uri() + "#timeline")
    tab.wait_for_selector("#ts-clock-note")
    assert "rank 1 shifted by -5000 us to align the ends of the same collectives" in tab.inner_text("#ts-clock-note")
    assert page.errors == []
