"""The profiler's own cost (capture/overhead.py, analysis/overhead.py): which steps the schedule records,
the step clock's unprofiled reference, and the shares corrected from it; trace_quality.profiler_overhead."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from test_rules_support import finding, findings, report
from torchscope.analysis import overhead
from torchscope.capture.overhead import REFERENCE_STEPS, FetchTimer, StepClock, step_state
from torchscope.report.measurements import Measurements, ProfilerOverhead
from torchscope.rundir.config import CaptureConfig


@pytest.mark.filterwarnings("ignore:Profiler won.t be using warmup")
def test_step_state_is_torch_profiler_schedule() -> None:
    torch_profiler = pytest.importorskip("torch.profiler")
    action = torch_profiler.ProfilerAction
    expected = {action.NONE: "none", action.WARMUP: "warmup", action.RECORD: "record", action.RECORD_AND_SAVE: "record"}
    for skip_first, wait, warmup, active, repeat in itertools.product((0, 2), (0, 1, 3), (0, 1), (1, 3), (0, 1, 2)):
        config = CaptureConfig(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
        schedule = torch_profiler.schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
        for step in range(30):
            assert step_state(config, step) == expected[schedule(step)], (config, step)


def test_step_clock_splits_steps_by_recording_and_keeps_a_reference() -> None:
    clock = StepClock(CaptureConfig())  # wait 1, warmup 1, active 3: steps 2-4 recorded
    clock.start()
    for _ in range(8):
        clock.step_ended()
        clock.step_started()
    assert len(clock.profiled_us) == 3
    assert len(clock.unprofiled_us) == 3  # steps 5-7 (step 0 pays one-time costs)
    assert len(clock.unprofiled_fetch_us) == len(clock.unprofiled_us)
    assert clock.wants_reference()
    clock.unprofiled_us.extend([1.0] * REFERENCE_STEPS)
    assert not clock.wants_reference()
    clock.stop()
    summary = clock.summary()
    assert set(summary) >= {"unprofiled_step_us", "profiled_step_us", "unprofiled_fetch_us"}


def test_fetch_timer_times_outermost_fetches_and_restores_the_original() -> None:
    dataloader = pytest.importorskip("torch.utils.data.dataloader")
    original = dataloader._BaseDataLoaderIter.__next__
    timer = FetchTimer()
    timer.install()
    try:
        loader = dataloader.DataLoader(list(range(6)), batch_size=2)
        assert len(list(loader)) == 3
        wall, cpu = timer.take()
        assert wall > 0 and cpu >= 0 and timer.take() == (0.0, 0.0)
    finally:
        timer.uninstall()
    assert dataloader._BaseDataLoaderIter.__next__ is original


class _SlowItems:
    """Items that take 20 ms each: a worker's first batch is slow whether or not the workers persist."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        import time

        time.sleep(0.02)
        return index


def test_fetch_timer_times_worker_restarts_only() -> None:
    """Restarts: a loader's workers started again (not its first start, never persistent ones, never a
    single-process loader), the restarted iterator's first fetch (kept apart) and the epoch's shutdown."""
    dataloader = pytest.importorskip("torch.utils.data.dataloader")
    original = dataloader._MultiProcessingDataLoaderIter.__init__
    timer = FetchTimer()
    timer.install()
    try:
        for loader in (dataloader.DataLoader(list(range(8)), batch_size=2),
                       dataloader.DataLoader(_SlowItems(), batch_size=2, num_workers=2, persistent_workers=True)):
            for _ in range(3):
                assert len(list(loader)) == 4
            assert timer.take_restarts() == (0.0, 0.0, 0), loader.num_workers
        loader = dataloader.DataLoader(_SlowItems(), batch_size=2, num_workers=2)
        assert len(list(loader)) == 4  # the first start: only its shutdown at the epoch's end counts
        first_epoch, first_fetch, restarts = timer.take_restarts()
        assert first_epoch > 0 and (first_fetch, restarts) == (0.0, 0)
        for _ in range(2):
            assert len(list(loader)) == 4
        turnover, first_fetch, restarts = timer.take_restarts()
        assert restarts == 2 and 2 * 0.02 <= first_fetch < turnover  # each first fetch waits for a batch
    finally:
        timer.uninstall()
    assert dataloader._MultiProcessingDataLoaderIter.__init__ is original


def _report(section: ProfilerOverhead, step_times: dict[str, Any], step_us: float | None = None, **phases: float) -> Any:
    return report(
        measurements=Measurements(profiler_overhead=section),
        breakdown=phases,
        phases=phases,
        manifest={"environment": {"step_times": step_times}},
        **({} if step_us is None else {"step_us": step_us}),
    )


def test_fetch_clock_measures_the_data_share_and_prices_events_on_it() -> None:
    # Recorded: data 6 ms (20k Python events), forward 3 ms (2k events), backward 1 ms (none).
    section = ProfilerOverhead(python_events_per_step={"data_loading": 20_000, "forward": 2_000})
    times = {
        "unprofiled_step_us": [6000.0, 6000.0, 6000.0],
        "unprofiled_fetch_us": [2000.0, 2000.0, 2000.0],
        "profiled_step_us": [10_000.0, 10_000.0],
    }
    rep = _report(section, times, data_loading=0.6, forward=0.3, backward=0.1)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.method == "fetch_clock"
    assert result.corrected_percent["data_loading"] == pytest.approx(100 / 3)
    # 4 ms of data overhead over 20k events: 0.2 us each, so forward loses 0.4 ms: 2.6 ms against backward's 1.
    assert result.corrected_percent["forward"] == pytest.approx((200 / 3) * 2.6 / 3.6)
    assert result.slowdown_by_phase["data_loading"] == pytest.approx(3.0)


def test_step_clock_spreads_the_overhead_by_events_without_fetch_times() -> None:
    section = ProfilerOverhead(python_events_per_step={"data_loading": 9_000, "forward": 1_000})
    times = {"unprofiled_step_us": [5000.0] * 3, "profiled_step_us": [10_000.0] * 3}
    rep = _report(section, times, data_loading=0.7, forward=0.3)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.method == "step_clock"
    # Half of the 10 ms step is overhead: 4.5 ms off data loading, 0.5 ms off forward.
    assert result.corrected_percent["data_loading"] == pytest.approx(100 * 2.5 / 5)


def test_no_reference_steps_no_correction() -> None:
    rep = _report(ProfilerOverhead(), {"unprofiled_step_us": [], "profiled_step_us": [1.0]}, data_loading=0.5)
    overhead.correct(rep)
    assert rep.measurements.profiler_overhead.method == "not_measured"
    assert "trace_quality.profiler_overhead" not in findings(rep)


def test_profiler_overhead_finding_states_the_slowdown() -> None:
    section = ProfilerOverhead(
        method="fetch_clock",
        unprofiled_step_us=5000.0,
        profiled_step_us=9000.0,
        slowdown_by_phase={"data_loading": 2.6, "forward": 1.1},
        corrected_percent={"data_loading": 40.0, "forward": 60.0},
    )
    f = finding(report(measurements=Measurements(profiler_overhead=section)), "trace_quality.profiler_overhead")
    assert f.title == "The profiler slowed the recorded steps 1.80x (data_loading 2.6x, forward 1.1x)"
    assert f.severity == "info" and f.fixes[0].target == "with_stack" and "capture with --no-stack" in f.recommendation
    # Captured without stacks already: no advice to turn them off, nor a fix that is set.
    no_stack = {"options": {"with_stack": False}}
    f = finding(report(measurements=Measurements(profiler_overhead=section), manifest=no_stack), "trace_quality.profiler_overhead")
    assert f.fixes == [] and "--no-stack" not in f.recommendation and "stacks were off" in f.recommendation


def test_too_few_events_to_distort_is_negligible_whatever_the_clock_says() -> None:
    # 100 recorded events (at most ~0.2 ms) cannot explain a 5 ms difference: the load changed, not the
    # profiler (a sleeping __getitem__): the recorded shares stand.
    section = ProfilerOverhead(python_events_per_step={"data_loading": 50, "forward": 50})
    times = {"unprofiled_step_us": [5000.0] * 3, "unprofiled_fetch_us": [500.0] * 3, "profiled_step_us": [10_000.0] * 3}
    rep = _report(section, times, data_loading=0.5, forward=0.5)
    overhead.correct(rep)
    assert rep.measurements.profiler_overhead.method == "negligible"
    assert rep.measurements.profiler_overhead.corrected_percent["data_loading"] == 50.0


def test_step_clock_times_the_phases_of_unprofiled_steps_only() -> None:
    from torchscope.rundir.labels import BACKWARD, CLOSURE, FORWARD

    clock = StepClock(CaptureConfig())  # steps 2-4 recorded
    clock.start()
    for _ in range(8):
        clock.phase_ended(FORWARD, 0.002)
        clock.phase_ended(BACKWARD, 0.001)
        clock.phase_ended(BACKWARD, 0.001)  # two backward calls in a step add up
        clock.phase_ended(CLOSURE, 0.5)  # not a phase
        clock.step_ended()
        clock.step_started()
    clock.stop()
    phases = clock.summary()["unprofiled_phase_us"]
    assert len(phases["forward"]) == len(clock.unprofiled_us) == 3  # steps 5-7, not the recorded 2-4
    # Each step's time is capped at the step's own duration (the loop above takes microseconds).
    assert all(0 < us <= step for us, step in zip(phases["backward"], clock.unprofiled_us))
    assert phases["optimizer"] == [0.0, 0.0, 0.0]


def test_phase_clock_splits_compute_by_the_unprofiled_phase_medians() -> None:
    # Recorded (3 steps on a busy machine): forward 3 ms, backward 1 ms, other 1.2 ms. Unprofiled, timed by
    # the phase clock: forward 1 ms, backward 2 ms, 1 ms untimed (other), 2 ms fetch in a 6 ms step.
    section = ProfilerOverhead(python_events_per_step={"data_loading": 20_000, "forward": 2_000})
    times = {
        "unprofiled_step_us": [6000.0] * 3,
        "unprofiled_fetch_us": [2000.0] * 3,
        "profiled_step_us": [10_000.0] * 3,
        "unprofiled_phase_us": {"forward": [1000.0, 900.0, 5000.0], "backward": [2000.0] * 3, "optimizer": [0.0] * 3},
    }
    rep = _report(section, times, data_loading=0.6, forward=0.3, backward=0.1, other=0.12)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.method == "fetch_clock"
    shares = result.corrected_percent
    assert shares["data_loading"] == pytest.approx(100 / 3)
    # Medians: forward 1 ms (the 5 ms descheduled step does not count), backward 2 ms, the untimed remainder
    # (step - fetch - phases: 1.0, 1.1 and 0 ms) 1 ms, all "other" (the only untimed phase recorded).
    assert shares["forward"] == pytest.approx((200 / 3) * 1000 / 4000)
    assert shares["backward"] == pytest.approx((200 / 3) * 2000 / 4000)
    assert shares["other"] == pytest.approx((200 / 3) * 1000 / 4000)
    assert sum(shares.values()) == pytest.approx(100.0)
    # Not paired with the unprofiled steps: the event-priced estimate stands.
    times["unprofiled_phase_us"] = {"forward": [1000.0]}
    rep = _report(ProfilerOverhead(python_events_per_step={"data_loading": 20_000, "forward": 2_000}), times,
                  data_loading=0.6, forward=0.3, backward=0.1, other=0.12)
    overhead.correct(rep)
    assert rep.measurements.profiler_overhead.corrected_percent["forward"] > shares["forward"]


def test_phase_clock_without_fetch_times_splits_the_step_clock_shares() -> None:
    # No DataLoader (method step_clock): recorded forward 55 %, optimizer 40 % (forward with more events), other
    # 1.5 ms; the unprofiled steps' clock: forward 2 ms, optimizer 2 ms, 1 ms untimed ("other") in a 5 ms step.
    section = ProfilerOverhead(python_events_per_step={"forward": 9_000, "optimizer": 1_000})
    times = {
        "unprofiled_step_us": [5000.0] * 3,
        "profiled_step_us": [11_000.0] * 3,
        "unprofiled_phase_us": {"forward": [2000.0] * 3, "backward": [0.0] * 3, "optimizer": [2000.0] * 3},
    }
    rep = _report(section, times, forward=0.55, optimizer=0.4, other=0.15)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.method == "step_clock"
    assert result.corrected_percent == pytest.approx({"forward": 40.0, "optimizer": 40.0, "other": 20.0})
    forward_us = rep.phases["forward"].us  # the recorded phase (0.55 of the test report's step)
    assert result.slowdown_by_phase["forward"] == pytest.approx(forward_us / 2000) and forward_us > 2000
    other_us = rep.phases["other"].us  # untimed: the step's remainder, 1 ms, is all "other"'s
    assert result.slowdown_by_phase["other"] == pytest.approx(other_us / 1000)


def test_batches_the_fetch_clock_did_not_time_share_the_untimed_remainder() -> None:
    # A generator's batches (no DataLoader): the clock timed no fetch (zeros), so data loading is one of the
    # untimed phases, not a measured 0 %. Its 60k Python events take all its recorded time at the events'
    # price, leaving no estimate to split by: the untimed 2 ms (6 - forward 3 - optimizer 1) go by the
    # recorded times, data 2.4 against other 0.1.
    section = ProfilerOverhead(python_events_per_step={"data_loading": 60_000, "forward": 1_000}, ops_per_step={"forward": 2_000})
    times = {
        "unprofiled_step_us": [6000.0] * 3,
        "unprofiled_fetch_us": [0.0] * 3,
        "profiled_step_us": [10_000.0] * 3,
        "unprofiled_phase_us": {"forward": [3000.0] * 3, "backward": [0.0] * 3, "optimizer": [1000.0] * 3},
    }
    rep = _report(section, times, data_loading=0.24, forward=0.65, optimizer=0.1, other=0.01)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.method == "step_clock"
    shares = result.corrected_percent
    assert shares["data_loading"] == pytest.approx(100 * (2000 * 24 / 25) / 6000)
    assert shares["other"] == pytest.approx(100 * (2000 * 1 / 25) / 6000)
    assert shares["forward"] == pytest.approx(50.0)
    # The slowdowns tell the same story as the shares: recorded over unprofiled time, per phase.
    assert result.slowdown_by_phase["data_loading"] == pytest.approx(rep.phases["data_loading"].us / (2000 * 24 / 25))


def test_an_untimed_phase_keeps_no_more_than_it_recorded() -> None:
    # LBFGS: the closure's loss and zero_grad are the trace's forward but no module call the clock times,
    # so the untimed remainder (1 ms) exceeds the 0.2 ms "other" recorded. "other" keeps 0.2 ms (the profiler
    # cannot have made it faster); the 0.8 ms left go to the timed phases by what the trace holds beyond
    # their clock: forward 3 ms, backward and optimizer 0.4 ms each.
    section = ProfilerOverhead(python_events_per_step={"forward": 4_000, "optimizer": 1_000})
    times = {
        "unprofiled_step_us": [9000.0] * 3,
        "profiled_step_us": [14_000.0] * 3,
        "unprofiled_phase_us": {"forward": [2000.0] * 3, "backward": [2000.0] * 3, "optimizer": [4000.0] * 3},
    }
    rep = _report(section, times, forward=0.5, backward=0.24, optimizer=0.44, other=0.02)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.corrected_percent["other"] == pytest.approx(100 * 200 / 9000)
    assert result.corrected_percent["forward"] == pytest.approx(100 * (2000 + 800 * 3 / 3.8) / 9000)
    assert sum(result.corrected_percent.values()) == pytest.approx(100.0)
    assert result.slowdown_by_phase["other"] == pytest.approx(1.0)
    assert all(factor >= 1.0 for factor in result.slowdown_by_phase.values())


def test_phases_recorded_inside_a_clocked_phase_take_their_part_of_its_clock() -> None:
    # DDP with gradient accumulation (gloo, CPU): the all-reduces run inside loss.backward(), so the phase
    # clock's backward (128 ms) holds them, while the trace's partition gives 149 of the 289 ms recorded
    # inside the backward labels to communication. Communication takes its recorded share of the clock's
    # backward, not the step's untimed remainder (2 ms here), which made it "82x slowed" by the profiler.
    section = ProfilerOverhead(
        python_events_per_step={"forward": 20_000, "backward": 30_000},
        within_clocked_us_per_step={"backward:backward": 139_797.0, "backward:communication": 149_307.0, "forward:forward": 19_000.0},
    )
    times = {
        "unprofiled_step_us": [151_000.0] * 3,
        "profiled_step_us": [317_000.0] * 3,
        "unprofiled_phase_us": {"forward": [18_000.0] * 3, "backward": [128_000.0] * 3, "optimizer": [3_000.0] * 3},
    }
    recorded = {"forward": 0.072, "backward": 0.441, "optimizer": 0.012, "communication": 0.471, "other": 0.004}
    rep = _report(section, times, 317_000.0, **recorded)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    communication = 128_000 * 149_307 / (149_307 + 139_797)
    # The untimed 2 ms are "other"'s, which keeps the 1.27 ms it recorded; the rest goes to the timed phases
    # by what the trace holds beyond their clock.
    backward = 128_000 - communication
    beyond = {"forward": 22_824 - 18_000, "backward": 139_797 - backward, "optimizer": 3_804 - 3_000}
    backward += (2_000 - 1_268) * beyond["backward"] / sum(beyond.values())
    assert result.corrected_percent["communication"] == pytest.approx(100 * communication / 151_000, rel=0.01)
    assert result.corrected_percent["other"] == pytest.approx(100 * 1_268 / 151_000)
    assert result.corrected_percent["backward"] == pytest.approx(100 * backward / 151_000, rel=0.01)
    assert sum(result.corrected_percent.values()) == pytest.approx(100.0)
    assert all(1.0 <= factor < 3 for factor in result.slowdown_by_phase.values()), result.slowdown_by_phase
    # Without the recorded split (a trace from before the field, or no labels): communication is left the
    # untimed remainder, as before.
    rep = _report(ProfilerOverhead(python_events_per_step={"forward": 20_000, "backward": 30_000}), times, 317_000.0, **recorded)
    overhead.correct(rep)
    assert rep.measurements.profiler_overhead.corrected_percent["communication"] < 2.0


def test_a_clocked_phase_inside_another_clocked_range_gets_its_part() -> None:
    # Optimizer-in-backward (post-accumulate-grad hooks): the optimizer's steps run inside loss.backward(),
    # so the backward clock (8 ms) timed them and the optimizer clock saw nothing. The trace records 6 ms of
    # backward and 3 ms of optimizer inside the backward ranges: the optimizer gets a third of the 8 ms.
    section = ProfilerOverhead(
        python_events_per_step={"forward": 20_000, "backward": 30_000},
        within_clocked_us_per_step={"backward:backward": 6_000.0, "backward:optimizer": 3_000.0, "forward:forward": 2_000.0},
    )
    times = {
        "unprofiled_step_us": [10_000.0] * 3,
        "profiled_step_us": [14_000.0] * 3,
        "unprofiled_phase_us": {"forward": [2_000.0] * 3, "backward": [8_000.0] * 3, "optimizer": [0.0] * 3},
    }
    rep = _report(section, times, 14_000.0, forward=0.2, backward=0.5, optimizer=0.3)
    overhead.correct(rep)
    result = rep.measurements.profiler_overhead
    assert result.corrected_percent["optimizer"] == pytest.approx(100 * 8_000 / 3 / 10_000, rel=0.01)
    assert result.corrected_percent["backward"] == pytest.approx(100 * 8_000 * 2 / 3 / 10_000, rel=0.01)
    assert all(factor >= 1.0 for factor in result.slowdown_by_phase.values()), result.slowdown_by_phase


def test_step_clock_leaves_collections_in_the_profilers_step_out() -> None:
    # torch's profiler.step() exporting a trace runs between step_ended and step_started: its collections
    # (the exported events' garbage) are no step's.
    import gc

    clock = StepClock(CaptureConfig(wait=0, warmup=0, active=1))  # step 0 recorded, steps 1- unprofiled
    clock.start()
    for step in range(4):
        clock.step_ended()
        if step == 1:
            gc.collect()  # as the profiler's own step() would, between the two calls
        clock.step_started()
    clock.stop()
    summary = clock.summary()
    assert len(summary["unprofiled_step_us"]) == 3 and summary["unprofiled_gc_collections"] == 0
