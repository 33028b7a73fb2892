"""The step time's spread and a confidence interval of its mean (issue 13: "a default window long enough
for a stable verdict, with the step-time spread and its confidence").

Run-level, after assembly: over every recorded step of every rank (the figures the per-step means of the
report rest on) and over the capture's unprofiled steps (the manifest's step clock, ``capture/overhead.py``:
up to 30 steps no profiler recorded, the reference the data-loading share is taken from). The interval is
Student's t on the mean, as ``pipeline/noise.py`` uses for comparing runs: with 3 steps its half-width is
2.48 standard deviations, with 30 steps 0.37.
"""

from __future__ import annotations

import math
from typing import Sequence

from torchscope.analysis.overhead import step_times
from torchscope.report.measurements import StepTime
from torchscope.report.model import Report

CONFIDENCE = 0.95
TARGET_HALF_PERCENT = 10.0  # the interval a stable verdict wants: --active N that reaches it is suggested
MAX_STEPS = 1000
_Z = 1.959963984540054  # the normal quantile of 0.975 (statistics.NormalDist stays unimported: test_imports)


def t_quantile_975(df: int) -> float:
    """Student's t quantile of 0.975 (a 95 % two-sided interval): exact for 1 and 2 degrees of freedom,
    else the Cornish-Fisher expansion pipeline/noise.py uses (under 1 % off from 3 up)."""
    nu = max(int(df), 1)
    if nu == 1:
        return 12.706204736174698
    if nu == 2:
        return 4.302652729749464
    z = _Z
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / nu + g2 / nu**2 + g3 / nu**3 + g4 / nu**4


def spread(durations: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, sample standard deviation, coefficient of variation in %, half-width of the mean's 95 % interval);
    the deviation and interval are 0 below two steps."""
    n = len(durations)
    if n == 0:
        return 0.0, 0.0, 0.0, 0.0
    mean = math.fsum(durations) / n
    if n < 2:
        return mean, 0.0, 0.0, 0.0
    stdev = math.sqrt(math.fsum((d - mean) ** 2 for d in durations) / (n - 1))
    half = t_quantile_975(n - 1) * stdev / math.sqrt(n)
    return mean, stdev, 100.0 * stdev / mean if mean > 0 else 0.0, half


def steps_for(cv_percent: float, half_percent: float) -> int:
    """The fewest steps whose mean a step-time cv of ``cv_percent`` knows within ±``half_percent`` at 95 %
    (the interval narrows as t(n-1)/sqrt(n)); 0 without a spread, at most :data:`MAX_STEPS`."""
    if cv_percent <= 0 or half_percent <= 0:
        return 0
    n = 2
    while n < MAX_STEPS and t_quantile_975(n - 1) * cv_percent / math.sqrt(n) > half_percent:
        n += 1
    return n


def fill(report: Report) -> None:
    """Set ``report.measurements.step_time`` from the report's steps and its manifest's step clock."""
    section = StepTime()
    durations = [s.duration_us for s in report.steps]
    if durations:
        mean, stdev, cv, half = spread(durations)
        ordered = sorted(durations)
        middle = len(ordered) // 2
        section.steps = float(len(durations))
        section.mean_us, section.stdev_us, section.cv_percent = mean, stdev, cv
        section.median_us = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
        if half > 0:
            section.confidence = CONFIDENCE
            section.ci_low_us, section.ci_high_us = mean - half, mean + half
            section.ci_half_percent = 100.0 * half / mean if mean > 0 else 0.0
            section.steps_for_10_percent = float(steps_for(cv, TARGET_HALF_PERCENT))
    unprofiled, _, _ = step_times(report.run.manifest)
    if unprofiled:
        mean, _, cv, half = spread(unprofiled)
        section.unprofiled_steps = float(len(unprofiled))
        section.unprofiled_mean_us, section.unprofiled_cv_percent = mean, cv
        section.unprofiled_ci_half_percent = 100.0 * half / mean if mean > 0 else 0.0
    report.measurements.step_time = section
