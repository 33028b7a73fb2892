"""Distributed rules on hand-built Reports: communication.share and straggler.rank."""

from __future__ import annotations

import pytest
from test_rules_support import STEPS, finding, findings, fixes, gpu, report

from torchscope.report.measurements import DataParallel, Measurements
from torchscope.report.model import RankSummary


def _rank(rank: int, comm_us: float, step_us: float = 10_000.0, steps: int = STEPS) -> RankSummary:
    return RankSummary(
        rank=rank,
        worker=f"host_rank{rank}",
        files=[],
        steps=steps,
        mean_step_us=step_us,
        median_step_us=step_us,
        breakdown_us={},
        comm_us_per_step=comm_us,
        compute_us_per_step=9000.0 - comm_us,
    )


def test_communication_share_on_gpu() -> None:
    rep = report(device=gpu(), breakdown={"communication": 0.2}, ranks=[_rank(0, 2000), _rank(1, 2000)])
    f = finding(rep, "communication.share")
    assert (f.category, f.severity, f.time_share) == ("communication", "warning", 0.2)
    assert f.evidence == {"communication_us_per_step": 2000.0, "ranks": 2, "wrapper": ""}
    assert fixes(f) == {"DistributedDataParallel.no_sync": ("code_change", "with model.no_sync(): loss.backward()")}
    assert "bucket_cap_mb" in f.recommendation


@pytest.mark.parametrize(
    ("wrapper", "targets", "words"),
    [
        ("DistributedDataParallel", ["DistributedDataParallel.no_sync"], "bucket_cap_mb"),
        ("fully_shard", ["FSDPModule.set_modules_to_forward_prefetch", "fully_shard.reshard_after_forward"], "set_requires_gradient_sync(False)"),
        ("FullyShardedDataParallel", ["FullyShardedDataParallel.forward_prefetch", "FullyShardedDataParallel.sharding_strategy"], "BACKWARD_PRE"),
    ],
)
def test_communication_fixes_follow_the_data_parallel_wrapper(wrapper: str, targets: list[str], words: str) -> None:
    """DDP's buckets and comm hooks do nothing for FSDP, whose all-gathers are prefetched and resharded."""
    measurements = Measurements(data_parallel=DataParallel(wrapper=wrapper))
    rep = report(device=gpu(), breakdown={"communication": 0.2}, ranks=[_rank(0, 2000), _rank(1, 2000)], measurements=measurements)
    f = finding(rep, "communication.share")
    assert [fix.target for fix in f.fixes] == targets and f.evidence["wrapper"] == wrapper
    assert words in f.recommendation
    assert ("DDP" in f.recommendation) == (wrapper == "DistributedDataParallel")


def test_communication_on_cpu_reads_the_phase_and_is_info_below_ten_percent() -> None:
    f = finding(report(phases={"communication": 0.05}), "communication.share")
    assert (f.severity, f.time_share) == ("info", 0.05)
    assert finding(report(phases={"communication": 0.1}), "communication.share").severity == "warning"
    assert "communication.share" not in findings(report(device=gpu(), phases={"communication": 0.3}))  # GPU: breakdown


def test_straggler_is_the_rank_that_waits_least_in_collectives() -> None:
    ranks = [_rank(0, 3000), _rank(1, 3000), _rank(2, 200), _rank(3, 3000)]
    f = finding(report(ranks=ranks), "straggler.rank")
    assert (f.category, f.severity, f.time_share) == ("straggler", "warning", 0.28)
    assert f.title == "Rank 2 holds the others back: ranks wait up to 2.8 ms per step in collectives"
    assert f.evidence == {
        "slow_rank": 2,
        "step_time_spread": 0.0,
        "comm_wait_spread": 0.28,
        "mean_step_us_by_rank": {"0": 10_000.0, "1": 10_000.0, "2": 10_000.0, "3": 10_000.0},
        "comm_us_per_step_by_rank": {"0": 3000.0, "1": 3000.0, "2": 200.0, "3": 3000.0},
        "compute_us_per_step_by_rank": {"0": 6000.0, "1": 6000.0, "2": 8800.0, "3": 6000.0},
    }
    assert f.fixes == []


def test_straggler_by_step_time_and_below_five_percent() -> None:
    slow = finding(report(ranks=[_rank(0, 1000), _rank(1, 1000, step_us=11_000)]), "straggler.rank")
    assert slow.evidence["slow_rank"] == 1
    assert slow.time_share == round(1000 / 10_500, 4)
    assert "straggler.rank" not in findings(report(ranks=[_rank(0, 1000), _rank(1, 1000, step_us=10_400)]))
    assert "straggler.rank" not in findings(report(ranks=[_rank(0, 3000), _rank(1, 200, steps=0)]))  # one rank with steps


@pytest.mark.parametrize(
    ("wrapper", "target", "words"),
    [("fully_shard", "fully_shard(block)", "fully_shard(block) for every transformer block"),
     ("FullyShardedDataParallel", "FullyShardedDataParallel.auto_wrap_policy", "auto_wrap_policy=ModuleWrapPolicy({Block})")],
)
def test_a_model_that_is_one_fsdp_unit_is_told_to_shard_its_blocks(wrapper: str, target: str, words: str) -> None:
    """One unit all-gathers every parameter at once with nothing to overlap: prefetching and resharding change
    nothing (measured on 2 gloo ranks: FSDP1 root-only, the same one all-gather per step with every option)."""
    measurements = Measurements(data_parallel=DataParallel(wrapper=wrapper, units_per_forward=1.0))
    rep = report(device=gpu(), breakdown={"communication": 0.2}, ranks=[_rank(0, 2000), _rank(1, 2000)], measurements=measurements)
    f = finding(rep, "communication.share")
    assert [fix.target for fix in f.fixes] == [target] and words in f.recommendation
    assert f.recommendation.startswith("The model is one FSDP unit (1 per forward pass)") and "prefetch" not in f.fixes[0].summary
