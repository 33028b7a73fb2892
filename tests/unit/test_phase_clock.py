"""The compute phases' spread over the unprofiled steps (analysis/phase_clock.py) and
data_loading.oversubscribed_workers, on hand-built manifests and Reports."""

from __future__ import annotations

from typing import Any

import pytest
from test_rules_support import finding, findings, report

from torchscope.analysis import phase_clock
from torchscope.report.measurements import Measurements, PhaseClock


def _manifest(forward: list[float], backward: list[float], workers: int = 2, threads: int = 2, cpus: int = 2,
              rest_cpu: float | None = 1.0, workers_cpu_s: float = 0.1, optimizer: list[float] | None = None) -> dict[str, Any]:
    n = len(forward)
    times: dict[str, Any] = {
        "unprofiled_step_us": [15_000.0] * n,
        "profiled_step_us": [16_000.0] * 3,
        "unprofiled_phase_us": {"forward": forward, "backward": backward, "optimizer": optimizer or [500.0] * n},
    }
    if rest_cpu is not None:
        times["rest_cpu_per_wall"] = rest_cpu
    # The recorded window's CPU: the process 0.17 s, its tree (with the workers) 0.17 s + `workers_cpu_s`.
    contention = {"wall_s": 0.2, "process_cpu_s": 0.17, "own_cpu_s": 0.17 + workers_cpu_s}
    return {"environment": {"cpu_count": cpus, "torch_num_threads": threads, "step_times": times, "contention": contention,
                            "dataloaders": [{"class": "DataLoader", "num_workers": workers, "iterations": 1}]}}


# 30 steps: compute alone in 3 of them (forward 1.2 ms, backward 1 ms), contended in the rest (4 and 3 ms).
CONTENDED = _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27)


def test_medians_fastest_tenth_and_excess_from_the_phase_clock() -> None:
    rep = report(manifest=CONTENDED)
    phase_clock.from_step_clock(rep)
    clock = rep.measurements.phase_clock
    assert clock.unprofiled_steps == 30 and clock.step_median_us == 15_000
    assert clock.median_us == {"forward": 4_000, "backward": 3_000, "optimizer": 500}
    assert clock.fastest_us == {"forward": 1_200, "backward": 1_000, "optimizer": 500}  # an observed step, not between two
    assert clock.excess_us_per_step == pytest.approx(sum(clock.median_us.values()) - sum(clock.fastest_us.values()))
    assert clock.compute_cpu_per_wall == 1.0 and clock.children_cpu_per_wall == pytest.approx(0.5)


def test_too_few_clocked_steps_fill_nothing() -> None:
    rep = report(manifest=_manifest([1_000.0] * 9, [1_000.0] * 9))
    phase_clock.from_step_clock(rep)
    assert rep.measurements.phase_clock == PhaseClock()


def _clocked(manifest: dict[str, Any]) -> Any:
    rep = report(manifest=manifest)
    phase_clock.from_step_clock(rep)
    return rep


def test_workers_beyond_the_free_cores_slow_compute() -> None:
    f = finding(_clocked(CONTENDED), "data_loading.oversubscribed_workers")
    clock_excess = f.evidence["contention_us_per_step"]
    # The workers use 0.5 CPU per wall second, 7.5 ms a step: more than the 4.8 ms the contention costs, so
    # dropping them would lose more than it saves: one worker and one compute thread instead.
    assert f.evidence["workers_cpu_us_per_step"] == pytest.approx(7_500)
    assert {fix.target: fix.value for fix in f.fixes} == {"torch.set_num_threads": 1, "num_workers": 1}
    assert "Split the cores instead of dropping the workers: torch.set_num_threads(1) with num_workers=1" in f.recommendation
    assert "torchscope tune --try set_num_threads=1,num_workers=1" in f.recommendation
    assert f.time_share_low == 0 and f.time_share_high == pytest.approx(clock_excess / 15_000, abs=1e-4)  # may save nothing
    f = finding(_clocked(_manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers=1)),
                "data_loading.oversubscribed_workers")
    assert {fix.target: fix.value for fix in f.fixes} == {"torch.set_num_threads": 1}
    # Light loading (0.25 CPU per wall second, 3.75 ms a step, under the contention's 4.8 ms): fewer workers.
    light = _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers_cpu_s=0.05)
    f = finding(_clocked(light), "data_loading.oversubscribed_workers")
    assert {fix.target: fix.value for fix in f.fixes} == {"num_workers": 0}
    # High: the median over the fastest tenth; low: compute got 1.0 of its 2 threads' cores, half of 7.5 ms.
    assert f.time_share_high == pytest.approx(f.evidence["contention_us_per_step"] / 15_000, abs=1e-4)
    assert f.time_share_low == pytest.approx(0.5 * 7_500 / 15_000, abs=1e-4)
    # ... and, with one worker, keeping it and giving compute one thread is the alternative.
    light = _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers=1, workers_cpu_s=0.05)
    f = finding(_clocked(light), "data_loading.oversubscribed_workers")
    assert {fix.target: fix.value for fix in f.fixes} == {"num_workers": 0, "torch.set_num_threads": 1}


@pytest.mark.parametrize(
    "manifest",
    [
        _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers=2, threads=2, cpus=8),  # fits
        _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers=0),  # no workers
        _manifest([1_000.0] * 30, [1_000.0] * 30),  # oversubscribed, yet compute is steady
        # The spread, but workers that wait on I/O (0.01 s of CPU in the 0.2 s window): work varying per step.
        _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, workers_cpu_s=0.01),
        # No CPU/wall of compute recorded (an older capture): no evidence it went short of cores.
        _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, rest_cpu=None),
        # Compute got both cores: the spread is not the workers'.
        _manifest([1_200.0] * 3 + [4_000.0] * 27, [1_000.0] * 3 + [3_000.0] * 27, rest_cpu=2.0),
    ],
)
def test_no_finding_without_both_oversubscription_and_slow_compute(manifest: dict[str, Any]) -> None:
    assert "data_loading.oversubscribed_workers" not in findings(_clocked(manifest))


def test_gpu_runs_are_left_to_the_device_rules() -> None:
    from torchscope.report.model import DeviceSummary

    rep = report(manifest=CONTENDED, device=DeviceSummary(present=True))
    phase_clock.from_step_clock(rep)
    assert "data_loading.oversubscribed_workers" not in findings(rep)


def test_section_is_run_level_only() -> None:
    assert Measurements().phase_clock == PhaseClock()


def test_a_phase_that_skips_steps_is_read_over_the_steps_it_ran_in() -> None:
    # The optimizer steps every other step (gradient accumulation): 0 in half the steps is no contention.
    optimizer = [0.0, 900.0] * 15
    rep = report(manifest=_manifest([1_000.0] * 30, [1_000.0] * 30, optimizer=optimizer))
    phase_clock.from_step_clock(rep)
    assert rep.measurements.phase_clock.median_us["optimizer"] == 900.0
    assert rep.measurements.phase_clock.excess_us_per_step == 0.0
