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


def _device_report(overlap_by_step: dict[str, float]) -> Report:
    """Hand-built GPU figures: the renderer only presents what the section holds."""
    from torchscope.report.distributed import Distributed, RankDistributed

    ranks = [
        RankDistributed(rank=0, steps=3, step_us=9000.0, idle_pct=53.6, compute_pct=17.7, non_compute_pct=28.7,
                        comm_compute_overlap_pct=11.8, overlap_pct_by_step=overlap_by_step),
        RankDistributed(rank=1, steps=3, step_us=9100.0, idle_pct=54.7, compute_pct=22.6, non_compute_pct=22.7,
                        comm_compute_overlap_pct=20.1, overlap_pct_by_step={k: v + 1 for k, v in overlap_by_step.items()}),
    ]
    section = Distributed(present=True, world_size=2, source="kernel", match_method="order", matched=3, ranks=ranks)
    return Report(torchscope_version="test", run=RunInfo(paths=[], trace_files=[], ranks=[0, 1], device_kind="cuda"),
                  steps=[], breakdown={}, distributed=section)


def _table(text: str, title: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(title))
    return [line.split() for line in lines[start + 1:] if line.strip()][:4]


def test_device_time_and_overlap_per_step_per_rank() -> None:
    text = render_terminal(_device_report({"10": 7.0, "3": 40.0, "4": 55.5}), width=100)
    header, _, rank0, rank1 = _table(text, "Device time per rank (%)")
    assert header == ["rank", "idle", "compute", "non-compute", "overlap", "#3", "#4", "#10"]  # steps in number order
    assert rank0 == ["0", "53.6", "17.7", "28.7", "11.8", "40.0", "55.5", "7.0"]
    assert rank1 == ["1", "54.7", "22.6", "22.7", "20.1", "41.0", "56.5", "8.0"]


def test_overlap_beyond_ten_steps_points_to_the_json() -> None:
    text = render_terminal(_device_report({str(s): float(s) for s in range(12)}), width=160)
    header = _table(text, "Device time per rank (%)")[0]
    assert header[-1] == "#9" and "#10" not in header
    assert "2 more step(s) in the JSON report" in " ".join(text.split())


def test_cpu_ranks_have_no_device_table() -> None:
    assert "Device time per rank" not in render_terminal(_report(4, late_rank=2), width=100)
