"""Input-pipeline rules on hand-built Reports: data_loading.exposed, h2d_copy.pageable, h2d_copy.blocking."""

from __future__ import annotations

import pytest

from test_rules_support import STEP_US, finding, findings, fixes, gpu, report
from torchscope.report.measurements import Copies, DataLoader, Measurements, Synchronization
from torchscope.report.model import Severity


def _loader(single: float = 0.0, multi: float = 0.0) -> Measurements:
    return Measurements(dataloader=DataLoader(single_process_fetches=single, multi_process_fetches=multi))


def test_data_loading_with_num_workers_0_suggests_workers_per_rank() -> None:
    rep = report(
        measurements=_loader(single=8),
        breakdown={"data_loading": 0.2},
        phases={"data_loading": 0.25},
        device=gpu(),
        manifest={"environment": {"cpu_count": 16, "local_world_size": 2}},
    )
    f = finding(rep, "data_loading.exposed")
    assert (f.category, f.severity, f.time_share) == ("data_loading", "warning", 0.2)
    assert f.evidence["exposed_us_per_step"] == 2000.0
    assert f.evidence["data_loading_us_per_step_incl_hidden"] == 2500.0
    assert f.evidence["num_workers_zero"] is True and f.evidence["multi_process_loader"] is False
    assert (f.evidence["cpu_count"], f.evidence["cores_per_rank"]) == (16, 8)  # 16 CPUs / 2 ranks per node
    assert "num_workers=0" in f.title
    # Loading is a quarter of compute: one worker keeps up, two leave a margin (7 cores are free on a GPU rank).
    assert "num_workers=2" in f.recommendation
    assert fixes(f) == {
        "num_workers": ("dataloader_kwarg", 2),
        "pin_memory": ("dataloader_kwarg", True),
        "persistent_workers": ("dataloader_kwarg", True),
    }


def test_data_loading_severity_follows_the_share() -> None:
    def severity(share: float) -> Severity:
        return finding(report(measurements=_loader(single=1), breakdown={"data_loading": share}), "data_loading.exposed").severity

    assert severity(0.04) == "info"  # below TB's 5 %: reported, not a warning
    assert severity(0.05) == "warning"
    assert severity(0.30) == "critical"


def test_slow_workers_on_a_cpu_run_without_a_cpu_count() -> None:
    f = finding(report(measurements=_loader(multi=8), breakdown={"data_loading": 0.1}), "data_loading.exposed")
    assert f.evidence["multi_process_loader"] is True and f.evidence["num_workers_zero"] is False
    assert f.evidence["cpu_count"] is None
    # The current worker count is unknown, so no number to raise it to; no pin_memory without an accelerator.
    assert "not recorded" in f.recommendation
    assert fixes(f) == {}


def test_no_data_loading_finding_without_exposed_loading_time() -> None:
    rep = report(measurements=_loader(single=8), phases={"data_loading": 0.3})  # hidden behind device work
    assert "data_loading.exposed" not in findings(rep)


def _pageable(us: float, count: float = 2.0) -> Measurements:
    return Measurements(
        copies=Copies(
            pageable_htod_per_step=count,
            pageable_htod_us_per_step=us,
            pageable_htod_bytes_per_step=64 * 2**20,
            pageable_bandwidth_gbps=5.5,
        )
    )


def test_pageable_copies() -> None:
    f = finding(report(measurements=_pageable(800.0), device=gpu()), "h2d_copy.pageable")
    assert (f.category, f.severity, f.time_share) == ("h2d_copy", "warning", 0.08)
    assert f.evidence == {
        "pageable_copies_per_step": 2.0,
        "pageable_copy_us_per_step": 800.0,
        "pageable_bytes_per_step": 64 * 2**20,
        "median_bandwidth_gbps": 5.5,
    }
    assert fixes(f) == {
        "pin_memory": ("dataloader_kwarg", True),
        "Tensor.to": ("code_change", "batch.to(device, non_blocking=True)"),
    }


def test_pageable_copies_are_never_critical_and_info_below_two_percent() -> None:
    assert finding(report(measurements=_pageable(5000.0), device=gpu()), "h2d_copy.pageable").severity == "warning"
    small = finding(report(measurements=_pageable(100.0), device=gpu()), "h2d_copy.pageable")
    assert (small.severity, small.time_share) == ("info", 0.01)
    assert "h2d_copy.pageable" not in findings(report(measurements=_pageable(0.0, count=0.0), device=gpu()))


def _syncs(by_op: dict[str, float]) -> Measurements:
    return Measurements(sync=Synchronization(syncs_per_step=2.0, sync_us_per_step=sum(by_op.values()), by_op=by_op))


def test_blocking_copies_claim_the_syncs_under_copy_ops() -> None:
    f = finding(report(measurements=_syncs({"aten::to": 400.0, "aten::item": 100.0}), device=gpu()), "h2d_copy.blocking")
    assert (f.category, f.severity, f.time_share) == ("h2d_copy", "warning", 0.04)
    assert f.evidence == {"blocking_copy_sync_us_per_step": 400.0, "by_op_us_per_step": {"aten::to": 400.0}}
    assert fixes(f) == {
        "Tensor.to": ("code_change", "batch.to(device, non_blocking=True)"),
        "pin_memory": ("dataloader_kwarg", True),
        "tensor factories": ("code_change", "torch.zeros(..., device='cuda')"),
    }


def test_blocking_copies_below_threshold_and_without_a_device() -> None:
    small = finding(report(measurements=_syncs({"aten::copy_": 0.01 * STEP_US}), device=gpu()), "h2d_copy.blocking")
    assert small.severity == "info"
    assert small.time_share == pytest.approx(0.01)
    assert "h2d_copy.blocking" not in findings(report(measurements=_syncs({"aten::to": 400.0})))  # CPU run
    assert "h2d_copy.blocking" not in findings(report(measurements=_syncs({"aten::item": 400.0}), device=gpu()))


def test_worker_restarts_from_the_step_clock() -> None:
    """The workers' start and shutdown (the turnover less the first fetches, whose first batch persistent
    workers load too) is the low end; the turnover steps' excess over a typical step (or the whole
    turnover) the high."""
    section = DataLoader(unprofiled_steps=30, unprofiled_step_mean_us=10_000.0, worker_restarts_per_step=0.2,
                            restart_us_per_step=6000.0, restart_first_fetch_us_per_step=2000.0,
                            restart_step_excess_us_per_step=7000.0)
    f = finding(report(measurements=Measurements(dataloader=section)), "data_loading.worker_restarts")
    assert (f.time_share_low, f.time_share_high, f.time_share) == pytest.approx((0.4, 0.7, 0.55))
    assert "every 5 steps (30.0 ms each): 60.0% of the mean step" in f.title and f.severity == "critical"
    assert [(x.target, x.value) for x in f.fixes] == [("persistent_workers", True)]
    quiet = DataLoader(unprofiled_steps=30, unprofiled_step_mean_us=10_000.0, worker_restarts_per_step=0.02,
                          restart_us_per_step=100.0)
    assert "data_loading.worker_restarts" not in findings(report(measurements=Measurements(dataloader=quiet)))
    assert "data_loading.worker_restarts" not in findings(report())


def test_torchs_default_collate_is_told_to_fetch_the_batch_at_once_a_users_collate_to_stack() -> None:
    from torchscope.report.measurements import Getitem

    def loading(collate: str) -> str:
        measurements = Measurements(dataloader=DataLoader(single_process_fetches=3),
                                    getitem=Getitem(getitem_us_per_step=100.0, collate_us_per_step={collate: 900.0}))
        rep = report(measurements=measurements, breakdown={"data_loading": 0.2}, manifest={"environment": {"cpu_count": 2}})
        return finding(rep, "data_loading.exposed").recommendation

    # torch's default_collate only stacks: the cost is the batch built from single samples.
    default = loading("default_collate (collate.py:340)")
    assert "The collate_fn, default_collate (collate.py:340)" in default and "(90 % of the fetch, recorded)" in default
    assert "BatchSampler" in default and "batch_size=None" in default and "keep it to stacking" not in default
    own = loading("collate (train.py:12)")
    assert "keep it to stacking tensors" in own and "BatchSampler" not in own
