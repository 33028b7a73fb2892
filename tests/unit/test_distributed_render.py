"""The across-ranks section in the terminal: ranks side by side up to 16 ranks, min / median / max with
the highest ranks beyond; the old Ranks table when no collective was matched."""

from __future__ import annotations

from torchscope.analysis.collective_match import collective_table
from torchscope.analysis.collectives import RankCollectives
from torchscope.analysis.distributed import summarise
from torchscope.render.terminal import render_terminal
from torchscope.report.model import Report, RunInfo


def _rank(late_us: float) -> RankCollectives:
    steps = list(range(4))
    return RankCollectives(
        source="backend", names=["all_reduce"], groups=[""], name_id=[0] * 4, group_id=[0] * 4, step=steps,
        ordinal=[0] * 4, seq=[-1] * 4, start_us=[10_000.0 * s + late_us for s in steps], dur_us=[6000.0 - late_us] * 4,
        compute_overlap_us=[0.0] * 4, nelems=[1] * 4, step_numbers=steps, step_us=[10_000.0] * 4,
        phase_us={"forward": [3000.0 + late_us] * 4, "other": [500.0] * 4}, culprits_us={},
    )


def _report(world: int, late_rank: int) -> Report:
    ranks = list(range(world))
    extracts = [[_rank(5000.0 if r == late_rank else 0.0)] for r in ranks]
    section = summarise(ranks, extracts, collective_table(ranks, extracts))
    return Report(torchscope_version="test", run=RunInfo(paths=[], trace_files=[], ranks=ranks, device_kind="cpu"),
                  steps=[], breakdown={}, distributed=section)


def test_few_ranks_side_by_side() -> None:
    text = render_terminal(_report(4, late_rank=2), width=100)
    assert "4 rank(s), 4 collective(s) matched by order of occurrence" in text
    rows = [line.split() for line in text.splitlines() if line.strip()[:2] in ("0 ", "1 ", "2*", "3 ")]
    assert [r[0] for r in rows] == ["0", "1", "2*", "3"]
    assert rows[2][-1] == "5.0" and rows[0][-1] == "-"  # late by 5 ms; the others are not late
    assert "* the rank the others wait for" in text


def test_many_ranks_are_summarised() -> None:
    text = render_terminal(_report(64, late_rank=41), width=100)
    assert "64 ranks (per step; min / median / max)" in text
    late = next(line for line in text.splitlines() if line.strip().startswith("lateness"))
    assert late.split()[-3] == "41,"  # the highest ranks, the late one first
    assert len([line for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]) == 0
