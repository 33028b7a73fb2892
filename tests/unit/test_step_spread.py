"""The step time's spread and the 95 % interval of its mean (pipeline/step_spread.py, issue 13)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from helpers.trace_builder import TraceBuilder

from torchscope.pipeline.noise import student_t_quantile
from torchscope.pipeline.step_spread import spread, t_quantile_975
from torchscope.report.model import Report


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 29, 200])
def test_t_quantile_is_noise_modules(df: int) -> None:
    assert t_quantile_975(df) == pytest.approx(student_t_quantile(0.975, df), rel=1e-9)


def test_spread_of_known_steps() -> None:
    steps = [100.0, 110.0, 90.0, 100.0]
    mean, stdev, cv, half = spread(steps)
    assert mean == 100.0 and stdev == pytest.approx(statistics.stdev(steps))
    assert cv == pytest.approx(stdev)  # percent of a mean of 100
    assert half == pytest.approx(3.182446305284263 * stdev / 2, rel=5e-3)  # exact t(3); the expansion is 0.12 % off
    assert spread([5.0])[1:] == (0.0, 0.0, 0.0) and spread([]) == (0.0, 0.0, 0.0, 0.0)


def test_report_states_the_spread_and_interval(tmp_path: Path) -> None:
    from torchscope.pipeline.analyze import analyze
    from torchscope.render.terminal import render_terminal

    b = TraceBuilder()
    t = 0.0
    for step, dur in enumerate([1000.0, 1200.0, 800.0, 1000.0]):
        b.step(step, t, dur)
        b.op("aten::mm", t + 10, dur - 20)
        t += dur
    b.write(tmp_path / "run" / "w.pt.trace.json")
    report = analyze([str(tmp_path / "run")], jobs=1, use_cache=False)
    st = report.measurements.step_time
    assert st.steps == 4 and st.mean_us == pytest.approx(1000.0) and st.median_us == pytest.approx(1000.0)
    half = t_quantile_975(3) * statistics.stdev([1000.0, 1200.0, 800.0, 1000.0]) / 2
    assert (st.ci_low_us, st.ci_high_us) == pytest.approx((1000.0 - half, 1000.0 + half))
    assert st.ci_half_percent == pytest.approx(half / 10) and st.confidence == 0.95
    assert st.unprofiled_steps == 0  # a bare trace: no capture clock
    assert f"±{math.floor(half / 10 + 0.5):.0f}% (95% CI, 4 steps" in render_terminal(report, width=100)


def test_steps_for_a_ten_percent_interval() -> None:
    from torchscope.pipeline.step_spread import steps_for

    assert steps_for(0.0, 10.0) == 0
    for cv in (4.0, 12.0, 30.0):
        n = steps_for(cv, 10.0)
        assert t_quantile_975(n - 1) * cv / math.sqrt(n) <= 10.0 < t_quantile_975(n - 2) * cv / math.sqrt(n - 1)
    assert steps_for(12.0, 10.0) == 9


def _report_of_steps(path: Path, durations: list[float]) -> "Report":
    from torchscope.pipeline.analyze import analyze

    b = TraceBuilder()
    t = 0.0
    for step, dur in enumerate(durations):
        b.step(step, t, dur)
        b.op("aten::mm", t + 10, dur - 20)
        t += dur
    b.write(path / "w.pt.trace.json")
    return analyze([str(path)], jobs=1, use_cache=False)


def test_a_wide_interval_suggests_how_many_steps_to_record(tmp_path: Path) -> None:
    """The default window records 3 steps (docs/capture.md): when their mean is known to worse than ±25 %,
    the step line says which --active gives ±10 %; a tight interval says nothing more."""
    from torchscope.pipeline.step_spread import steps_for
    from torchscope.render.terminal import render_terminal

    wide = _report_of_steps(tmp_path / "wide", [1000.0, 1400.0, 700.0])
    st = wide.measurements.step_time
    assert st.ci_half_percent > 25
    n = steps_for(st.cv_percent, 10.0)
    assert n > 3 and st.steps_for_10_percent == n
    assert f"--active {n} for ±10%" in render_terminal(wide, width=100)
    tight = _report_of_steps(tmp_path / "tight", [1000.0, 1010.0, 990.0])
    assert tight.measurements.step_time.ci_half_percent < 25
    assert "--active" not in render_terminal(tight, width=100)
