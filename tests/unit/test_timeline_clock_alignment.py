"""Multi-rank timelines on one clock: each rank's lanes shifted by the clock offset the distributed
analysis measured (the ends of the same collectives), on synthetic ranks whose clocks differ by a known
amount."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.trace_builder import TraceBuilder

from torchscope.analysis.timeline import Lane, Timeline, align_ranks
from torchscope.pipeline.analyze import analyze_run

SKEW_US = 5_000.0  # rank 1's clock runs this far ahead
STEP_US = 100_000.0


def _rank(tmp: Path, rank: int, compute_us: float, skew_us: float) -> None:
    """Steps of `compute_us` of compute then one all-reduce that ends, in true time, at 50 ms into the step."""
    trace = TraceBuilder().rank(rank, 2)
    trace.header["distributedInfo"]["backend"] = "gloo"
    for step in range(4):
        t0 = step * STEP_US + skew_us
        trace.step(step, t0, 60_000.0)
        trace.op("aten::mm", t0 + 1_000.0, compute_us)
        trace.annotation("gloo:all_reduce", t0 + 1_000.0 + compute_us, 49_000.0 - compute_us)
    trace.write(tmp / f"rank{rank}.json")


def _collective_ends(timeline: Timeline) -> dict[int, list[float]]:
    name = timeline.strings.index("gloo:all_reduce")
    ends: dict[int, list[float]] = {}
    for lane in timeline.lanes:
        if lane.kind == "host":
            ends.setdefault(lane.rank, []).extend(
                s + d for s, d, n in zip(lane.start_us, lane.dur_us, lane.name) if n == name)
    return ends


def test_the_same_collective_ends_at_the_same_time_on_every_rank_after_alignment(tmp_path: Path) -> None:
    _rank(tmp_path, 0, 10_000.0, 0.0)
    _rank(tmp_path, 1, 40_000.0, SKEW_US)  # late: rank 0 waits 30 ms in each all-reduce
    result = analyze_run(tmp_path, jobs=1, use_cache=False, sidecars=("timeline",))
    offsets = {r.rank: r.clock_offset_us for r in result.report.distributed.ranks}
    assert offsets == pytest.approx({0: 0.0, 1: SKEW_US})
    timeline = result.sidecars["timeline"]
    ends = _collective_ends(timeline)
    assert len(ends[0]) == len(ends[1]) == 4
    assert ends[1] == pytest.approx(ends[0], abs=0.01)
    assert timeline.clock_shift_us == pytest.approx({0: 0.0, 1: SKEW_US})
    assert "rank 1 shifted by -5000 us to align the ends of the same collectives" in timeline.clock_note
    assert min(min(lane.start_us) for lane in timeline.lanes if lane.start_us) == 0.0


def _lanes(*ranks_starts: tuple[int, list[float]]) -> Timeline:
    lanes = [Lane(rank=r, kind="host", label="t", start_us=s, dur_us=[1.0] * len(s), name=[0] * len(s),
                  depth=[0] * len(s), detail=[0] * len(s)) for r, s in ranks_starts]
    return Timeline(origin_us=1_000.0, strings=[""], lanes=lanes)


def test_a_rank_behind_the_reference_moves_the_origin_so_no_time_is_negative() -> None:
    aligned = align_ranks(_lanes((0, [0.0, 50.0]), (1, [10.0, 60.0])), {0: 0.0, 1: 30.0})
    assert [lane.start_us for lane in aligned.lanes] == [[20.0, 70.0], [0.0, 50.0]]
    assert aligned.origin_us == 980.0  # still the absolute time (reference clock) of 0


def test_ranks_on_one_host_share_its_clock_and_are_not_shifted() -> None:
    timeline = _lanes((0, [0.0]), (1, [10.0]))
    kept = align_ranks(timeline, {0: 0.0, 1: 8_000.0}, hosts=["node1"])
    assert [lane.start_us for lane in kept.lanes] == [[0.0], [10.0]] and not kept.clock_shift_us
    assert "one clock" in kept.clock_note
    assert align_ranks(timeline, {0: 0.0, 1: 0.0}) is timeline  # nothing to shift
