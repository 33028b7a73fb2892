"""Collectives across ranks: names, matching, waiting vs transfer, clocks, lateness and the straggler
(synthetic per-rank extracts), HTA's per-rank figures on the real NCCL traces, and the rules on
hand-built Reports."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
from test_rules_support import finding, findings, report

from torchscope.analysis.collective_match import collective_table
from torchscope.analysis.collectives import RankCollectives, collective_name
from torchscope.analysis.distributed import summarise
from torchscope.analysis.frames import is_user_frame
from torchscope.analysis.straggler import median_of_others
from torchscope.pipeline.analyze import analyze
from torchscope.report.distributed import Distributed, RankDistributed, Straggler


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("nccl:all_reduce", "all_reduce"),
        ("gloo:all_reduce", "all_reduce"),
        ("c10d::allreduce_", "all_reduce"),
        ("allreduce", "all_reduce"),
        ("c10d::_allgather_base_", "all_gather"),
        ("nccl:_all_gather_base", "all_gather"),
        ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
        ("nccl:send", "send_recv"),
        ("gloo:recv", "send_recv"),
        ("c10d::barrier", "barrier"),
        ("nccl:broadcast", "broadcast"),
    ],
)
def test_one_name_for_every_spelling(raw: str, name: str) -> None:
    assert collective_name(raw) == name


def test_user_frames() -> None:
    assert is_user_frame("train.py(12): decode_sample")
    assert is_user_frame("/home/me/project/model.py(3): forward")
    assert not is_user_frame("torch/nn/modules/module.py(1501): _call_impl")
    assert not is_user_frame("contextlib.py(132): __enter__")
    assert not is_user_frame("<built-in function sleep>")
    assert not is_user_frame("aten::mm")


def _rank(starts: list[float], durs: list[float], steps: list[int], seq: list[int] | None = None,
          phases: dict[str, list[float]] | None = None, culprits: dict[str, dict[str, float]] | None = None) -> RankCollectives:
    n = len(starts)
    step_numbers = sorted(set(steps))
    return RankCollectives(
        source="backend", names=["all_reduce"], groups=["0"], name_id=[0] * n, group_id=[0] * n,
        step=steps, ordinal=[steps[:i].count(s) for i, s in enumerate(steps)], seq=seq or [-1] * n,
        start_us=starts, dur_us=durs, compute_overlap_us=[0.0] * n, nelems=[1000] * n,
        step_numbers=step_numbers, step_us=[100_000.0] * len(step_numbers),
        phase_us=phases or {}, culprits_us=culprits or {},
    )


def test_matching_by_order_transfer_is_the_shortest_instance_and_the_rest_waiting() -> None:
    # Rank 1 arrives 30 ms late in both steps; the all-reduce itself takes 2 ms; rank 1's clock runs 5 ms ahead.
    ranks = [
        _rank([1000.0, 101_000.0], [32_000.0, 32_000.0], [1, 2]),
        _rank([36_000.0, 136_000.0], [2_000.0, 2_000.0], [1, 2]),
    ]
    table = collective_table([0, 1], [[r] for r in ranks])
    assert table.method == "order" and table.matched.all()
    assert table.transfer_us.tolist() == [2000.0] * 4
    assert sorted(table.wait_us.tolist()) == [0.0, 0.0, 30_000.0, 30_000.0]
    assert table.clock_offset_us.tolist() == [0.0, 5000.0]


def test_matching_by_sequence_number_ignores_order_and_steps() -> None:
    # The second rank's trace starts one collective later: by order they would pair wrongly, by Seq they pair right.
    first = _rank([0.0, 10_000.0, 20_000.0], [1000.0, 1000.0, 1000.0], [1, 1, 1], seq=[7, 8, 9])
    second = _rank([10_500.0, 20_500.0], [500.0, 500.0], [1, 1], seq=[8, 9])
    table = collective_table([0, 1], [[first], [second]])
    assert table.method == "sequence"
    assert int(table.matched.sum()) == 4 and table.transfer_us[table.matched].tolist() == [500.0] * 4
    assert table.clock_offset_us.tolist() == [0.0, 0.0]


def test_median_of_others() -> None:
    values = np.array([[10.0, 1.0], [10.0, np.nan], [0.0, 3.0]])
    assert median_of_others(values).tolist()[0] == [5.0, 3.0]
    assert median_of_others(values).tolist()[2] == [10.0, 1.0]


def _four_ranks(slow: int) -> tuple[list[int], list[list[RankCollectives]]]:
    """Four ranks, six steps; `slow` spends 40 ms more in its forward, in `slow_forward (train.py:9)`."""
    extracts = []
    for rank in range(4):
        late = 40_000.0 if rank == slow else 0.0
        starts = [100_000.0 * s + 50_000.0 + late for s in range(6)]
        durs = [3000.0 + (40_000.0 - late)] * 6
        phases = {"forward": [20_000.0 + late] * 6, "backward": [30_000.0] * 6, "data_loading": [1000.0] * 6}
        culprits = {"forward": {"train.py(9): slow_forward": 6 * late, "aten::mm": 6 * 15_000.0, "train.py(30): <module>": 6 * (20_000.0 + late)}}
        extracts.append([_rank(starts, durs, list(range(6)), phases=phases, culprits=culprits)])
    return list(range(4)), extracts


def test_the_straggler_its_late_phase_and_culprit() -> None:
    ranks, extracts = _four_ranks(slow=2)
    section = summarise(ranks, extracts, collective_table(ranks, extracts))
    late = section.straggler
    assert late is not None and late.rank == 2 and late.late_steps == 6
    assert late.median_lateness_us == pytest.approx(40_000.0)
    assert late.late_phase == "forward" and late.phase_excess_us_per_step["forward"] == pytest.approx(40_000.0)
    assert list(late.culprits_us_per_step) == ["slow_forward (train.py:9)", "<module> (train.py:30)"]
    assert {s.late_rank for s in section.steps} == {2}
    assert section.wait_us_per_step == pytest.approx(3 * 40_000.0 / 4)
    assert section.transfer_us_per_step == pytest.approx(3000.0)
    stats = {s.metric: s for s in section.stats}
    assert stats["lateness_us_per_step"].worst_ranks[0] == 2 and stats["wait_us_per_step"].min == 0.0


def test_no_straggler_when_ranks_arrive_together() -> None:
    ranks, extracts = _four_ranks(slow=-1)
    assert summarise(ranks, extracts, collective_table(ranks, extracts)).straggler is None


def test_many_ranks_stay_summarised() -> None:
    ranks = list(range(256))
    extracts = [[_rank([1000.0 * s + (5000.0 if r == 77 else 0.0) for s in range(4)], [6000.0 - (5000.0 if r == 77 else 0.0)] * 4, list(range(4)))] for r in ranks]
    section = summarise(ranks, extracts, collective_table(ranks, extracts))
    assert section.straggler is not None and section.straggler.rank == 77
    assert len(section.stats) >= 5 and all(len(s.worst_ranks) == 3 for s in section.stats)


# HTA 0.5.0 on the same files (../shared/traces/README.md): idle / compute / non-compute % and comm-comp overlap %.
HTA = {
    ("hta_two_ranks_nccl", 0): (53.56, 17.71, 28.74, 11.81),
    ("hta_two_ranks_nccl", 1): (54.72, 22.57, 22.72, 20.05),
    ("hta_nccl_rank0", 0): (77.78, 17.26, 4.97, 14.31),
}


@pytest.mark.parametrize("folder", ["hta_two_ranks_nccl", "hta_nccl_rank0"])
def test_per_rank_figures_agree_with_hta_within_one_point(shared_traces: Path, folder: str) -> None:
    section = analyze(shared_traces / "gpu" / folder).distributed
    assert section.present and section.source == "kernel"
    for row in section.ranks:
        ours = (row.idle_pct, row.compute_pct, row.non_compute_pct, row.comm_compute_overlap_pct)
        assert all(abs(a - b) <= 1.0 for a, b in zip(ours, HTA[(folder, row.rank)])), (row.rank, ours)  # type: ignore[operator]
        assert row.overlap_pct_by_step


def test_two_nccl_ranks_match_their_collectives(shared_traces: Path) -> None:
    section = analyze(shared_traces / "gpu" / "hta_two_ranks_nccl").distributed
    assert section.world_size == 2 and section.matched == 10 and section.unmatched == 0
    assert section.match_method == "order" and section.notes
    assert [c.name for c in section.collectives] == ["send_recv"]
    assert section.transfer_us_per_step > 0 and section.wait_us_per_step > 0


def _distributed_report(exposed: float, wait: float, straggler: Straggler | None) -> object:
    rep = report(step_us=100_000.0)
    rep.distributed = Distributed(
        present=True, world_size=2, matched=5, match_method="order", wait_us_per_step=wait,
        transfer_us_per_step=exposed, exposed_transfer_us_per_step=exposed,
        ranks=[RankDistributed(rank=0, steps=4), RankDistributed(rank=1, steps=4)], straggler=straggler,
    )
    return rep


def _straggler(lateness: float) -> Straggler:
    return Straggler(
        rank=1, median_lateness_us=lateness, mean_lateness_us=lateness, lateness_us_by_step={"5": lateness},
        late_steps=4, steps=4, late_phase="data_loading", phase_excess_us_per_step={"data_loading": lateness},
        culprits_us_per_step={"decode (train.py:3)": lateness},
    )


def test_waiting_goes_to_the_straggler_and_only_exposed_transfer_to_communication() -> None:
    rep = _distributed_report(exposed=2000.0, wait=40_000.0, straggler=_straggler(40_000.0))
    found = findings(rep)  # type: ignore[arg-type]
    assert found["communication.share"].severity == "info" and found["communication.share"].time_share == 0.02
    late = found["straggler.rank"]
    assert late.severity == "critical" and late.time_share == 0.4
    assert late.evidence["straggler_rank"] == 1 and late.evidence["late_phase"] == "data_loading"
    assert late.evidence["lateness_us_by_step"] == {"5": 40_000.0}
    assert "decode (train.py:3)" in late.title and "data loading" in late.title


def test_exposed_transfer_gets_the_transfer_advice_and_fixes() -> None:
    rep = _distributed_report(exposed=20_000.0, wait=0.0, straggler=None)
    comm = finding(rep, "communication.share")  # type: ignore[arg-type]
    assert comm.severity == "warning" and comm.evidence["exposed_transfer_us_per_step"] == 20_000.0
    assert {f.target for f in comm.fixes} == {
        "DistributedDataParallel.no_sync", "DistributedDataParallel.bucket_cap_mb", "DistributedDataParallel.register_comm_hook",
    }
    assert "straggler.rank" not in findings(rep)  # type: ignore[arg-type]


def test_no_late_phase_when_every_phase_is_a_little_slower() -> None:
    ranks, extracts = _four_ranks(slow=2)
    slow = extracts[2][0]
    slow.phase_us = {"forward": [24_000.0] * 6, "backward": [42_000.0] * 6, "data_loading": [13_000.0] * 6}  # +4, +12, +12 ms
    late = summarise(ranks, extracts, collective_table(ranks, extracts)).straggler
    assert late is not None and late.rank == 2 and late.late_phase is None and late.culprits_us_per_step == {}


def test_a_late_rank_faster_in_every_phase_is_not_told_its_phases_are_slower() -> None:
    # Rank 1 waits less (late) but spends less in every phase than the median rank: not its work.
    def late_rank(excess: dict[str, float], steps: int) -> str:
        straggler = msgspec.structs.replace(_straggler(40_000.0), late_phase=None, phase_excess_us_per_step=excess,
                                            culprits_us_per_step={}, steps=steps)
        rep = _distributed_report(exposed=2000.0, wait=40_000.0, straggler=straggler)
        return finding(rep, "straggler.rank").recommendation  # type: ignore[arg-type]

    faster = late_rank({"forward": -300.0, "backward": -1_300.0}, steps=3)
    assert "Its phases take no longer than the median rank's in all (1.6 ms less a step, against 40.0 ms late)" in faster
    assert "With 3 steps that can be noise" in faster and "every phase is a little slower" not in faster
    assert "can be noise" not in late_rank({"forward": -300.0}, steps=40)
    # Noise-sized excesses in three phases, milliseconds less in two: no phase is slower in any way that counts.
    mixed = late_rank({"forward": 40.0, "backward": 30.0, "optimizer": 30.0, "data_loading": -6_000.0, "outside_step": -2_000.0}, 3)
    assert "Its phases take no longer" in mixed and "every phase is a little slower" not in mixed
    # Slower phases adding up to the lateness: the host.
    assert "every phase is a little slower" in late_rank({"forward": 6_000.0, "backward": 5_000.0, "optimizer": 4_000.0}, steps=40)


def test_a_phase_a_few_microseconds_slower_is_no_cause_of_a_late_rank() -> None:
    ranks, extracts = _four_ranks(slow=2)
    late = summarise(ranks, extracts, collective_table(ranks, extracts)).straggler
    assert late is not None and late.rank == 2 and late.late_phase is not None  # the fixture's slow rank: one phase
    fast = extracts[2][0]
    fast.phase_us = {name: list(values) for name, values in extracts[0][0].phase_us.items()}
    fast.phase_us["forward"] = [v + 2.0 for v in fast.phase_us["forward"]]  # 2 us more a step, no more
    late = summarise(ranks, extracts, collective_table(ranks, extracts)).straggler
    assert late is not None and late.rank == 2 and late.late_phase is None


def test_concurrent_instances_share_their_steps_wall_time() -> None:
    from torchscope.analysis.collectives import _concurrency_weight

    step = np.array([1, 1, 2])
    weight = _concurrency_weight(step, np.array([0.0, 0.0, 10.0]), np.array([4.0, 4.0, 12.0]))  # two buckets at once
    assert weight.tolist() == [0.5, 0.5, 1.0]


def test_metrics_for_gates() -> None:
    from torchscope.report.metrics import metrics_of

    rep = _distributed_report(exposed=2000.0, wait=40_000.0, straggler=_straggler(40_000.0))
    named = {m.name: m for m in metrics_of(rep)}  # type: ignore[arg-type]
    assert named["collectives.wait_us_per_step"].value == 40_000.0
    assert named["collectives.exposed_transfer_us_per_step"].value == 2000.0
    assert named["straggler.median_lateness_us"].value == 40_000.0 and named["straggler.median_lateness_us"].better == "lower"


def test_median_of_others_is_np_nanmedian_of_the_other_ranks() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        values = np.round(rng.normal(0, 100, (int(rng.integers(1, 12)), int(rng.integers(1, 7)))), int(rng.integers(0, 3)))
        values[rng.random(values.shape) < 0.2] = np.nan  # ranks without the step
        if rng.random() < 0.3:
            values = np.round(values / 50) * 50  # ties
        expected = np.full(values.shape, np.nan)
        for r in range(values.shape[0]):
            others = np.delete(values, r, axis=0)
            has = ~np.isnan(others).all(axis=0)
            expected[r, has] = np.nanmedian(others[:, has], axis=0) + 0.0
        assert np.array_equal(median_of_others(values), expected, equal_nan=True)
