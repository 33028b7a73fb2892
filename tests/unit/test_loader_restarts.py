"""The DataLoader workers' turnover: the run-level figures read from the manifest's step clock."""

from __future__ import annotations

import pytest

from test_rules_support import report
from torchscope.analysis.loader_restarts import from_step_clock


def test_loader_restarts_from_the_step_clock() -> None:
    times = {"unprofiled_step_us": [1000.0, 41_000.0, 1200.0, 900.0, 40_000.0], "unprofiled_loader_restart_us": [0.0, 30_000.0, 0.0, 0.0, 31_000.0],
             "unprofiled_loader_first_fetch_us": [0.0, 10_000.0, 0.0, 0.0, 12_000.0],
             "unprofiled_loader_restarts": 2}
    result = report(manifest={"environment": {"step_times": times}})
    from_step_clock(result)
    section = result.measurements.dataloader
    assert (section.unprofiled_steps, section.worker_restarts_per_step) == (5, pytest.approx(0.4))
    assert section.restart_us_per_step == pytest.approx(61_000 / 5)
    assert section.restart_first_fetch_us_per_step == pytest.approx(22_000 / 5)
    assert section.restart_step_excess_us_per_step == pytest.approx((40_000 + 39_000) / 5)  # beyond the median 1000 us
    # Not paired with the steps (a damaged manifest), or no restart count: nothing is stated.
    for damaged in ({**times, "unprofiled_loader_restart_us": [1.0]}, {**times, "unprofiled_loader_restarts": None}):
        result = report(manifest={"environment": {"step_times": damaged}})
        from_step_clock(result)
        assert result.measurements.dataloader.unprofiled_steps == 0
