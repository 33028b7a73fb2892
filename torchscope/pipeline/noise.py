"""Is a change beyond noise? Welch's t interval for the difference of two means of per-step samples.

Why Welch's t: the two runs have their own, unequal spreads (another machine load, another batch mix)
and few steps (3-20); Welch's interval does not assume equal variances, and with so few samples it is
honest where a bootstrap is not (resampling 3 values gives at most 10 distinct means). Its assumption
is that steps are independent draws around the run's mean; steps of one run share that run's
conditions, so between-run variation the steps do not show (a warmer CPU, another process) is not in
them. It is added as a floor: each run's mean is taken to vary by `run_noise_pct` of itself from run to
run (4 % by default, measured on repeated identical runs: docs/ci.md), in quadrature with the steps'
own error. The regression gate also requires a change beyond a threshold (5 % by default).

Where each side is several runs (tune's baselines and repeated trials), the run itself is the unit:
`run_level_interval` compares the runs' means with a spread measured from them.
"""

from __future__ import annotations

import math
import statistics
from typing import Sequence

import msgspec

MIN_SAMPLES = 3  # fewer steps a side cannot tell noise from change (the profiler recipe's 3 active steps)
DEFAULT_RUN_NOISE_PCT = 4.0


class Interval(msgspec.Struct, frozen=True):
    """The change of the mean from base to new, relative to the base mean, in percent."""

    change_pct: float
    low_pct: float | None
    high_pct: float | None
    method: str

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        if self.low_pct is None or self.high_pct is None:
            return False
        return self.low_pct > 0 or self.high_pct < 0


def relative_change_interval(
    base: Sequence[float], new: Sequence[float], confidence: float = 0.95, run_noise_pct: float = DEFAULT_RUN_NOISE_PCT
) -> Interval:
    """Welch's interval for mean(new) - mean(base), divided by mean(base) (the base mean taken as known:
    its own error is in the interval's width already through its variance term), widened by the
    run-to-run floor `run_noise_pct` on each side."""
    base_mean = statistics.fmean(base) if base else 0.0
    new_mean = statistics.fmean(new) if new else 0.0
    change = 100.0 * (new_mean - base_mean) / base_mean if base_mean else 0.0
    if len(base) < MIN_SAMPLES or len(new) < MIN_SAMPLES or base_mean <= 0:
        return Interval(change, None, None, f"too few steps to tell ({len(base)} and {len(new)}; need {MIN_SAMPLES} each)")
    var_base = statistics.variance(base) / len(base)
    var_new = statistics.variance(new) / len(new)
    floor = (run_noise_pct / 100.0) ** 2 * (base_mean**2 + new_mean**2)
    se = math.sqrt(var_base + var_new + floor)
    if se == 0:
        return Interval(change, change, change, "Welch's t interval (no spread in either run)")
    # Welch-Satterthwaite degrees of freedom of the sampled part; the floor is taken as known.
    sampled = var_base**2 / (len(base) - 1) + var_new**2 / (len(new) - 1)
    df = (var_base + var_new) ** 2 / sampled if sampled > 0 else 1e9
    half = student_t_quantile(0.5 + confidence / 2, df) * se
    scale = 100.0 / base_mean
    return Interval(
        change,
        max(change - half * scale, -100.0),  # step times are positive: no mean falls by more than 100 %
        change + half * scale,
        f"Welch's t interval, {confidence:.0%}, df={df:.1f}, {len(base)} and {len(new)} steps, run-to-run floor {run_noise_pct:g} %",
    )


def student_t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t: exact for 1 and 2 degrees of freedom, else the Cornish-Fisher expansion
    (Abramowitz & Stegun 26.7.5; under 1 % off from 3 degrees of freedom up). A fractional df is rounded
    down, which widens the interval (the usual, conservative choice)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    nu = max(int(df), 1)
    if nu == 1:
        return math.tan(math.pi * (p - 0.5))
    if nu == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / nu + g2 / nu**2 + g3 / nu**3 + g4 / nu**4


def run_level_interval(
    base_runs: Sequence[Sequence[float]],
    new_runs: Sequence[Sequence[float]],
    confidence: float = 0.95,
    run_noise_pct: float = DEFAULT_RUN_NOISE_PCT,
) -> Interval:
    """The change of the mean step time when each side is several runs (processes) of per-step samples.

    Steps of one run share that run's conditions (where its memory landed, what else ran then), so on a
    shared machine runs of the same code differ far more than their steps do (15 % against 3 % measured
    on a 2-core VM: docs/tune.md). The unit of replication is then the run: each side's mean is the mean
    of its runs' means, and the run-to-run spread is pooled from every side that has two runs or more,
    never below `run_noise_pct` of the base mean. The interval is Student's t at the pooled degrees of
    freedom, so a spread measured from 2-3 runs widens the interval as much as its uncertainty deserves
    (treating it as known called changes of 13-26 % on a null candidate significant). Where no side has
    two runs there is no spread to measure: the per-step interval with the floor (`relative_change_interval`).
    """
    base = [list(r) for r in base_runs if len(r)]
    new = [list(r) for r in new_runs if len(r)]
    df = sum(len(side) - 1 for side in (base, new) if len(side) >= 2)
    if df == 0 or not base or not new:
        return relative_change_interval([s for r in base for s in r], [s for r in new for s in r], confidence, run_noise_pct)
    base_means = [statistics.fmean(r) for r in base]
    new_means = [statistics.fmean(r) for r in new]
    base_mean, new_mean = statistics.fmean(base_means), statistics.fmean(new_means)
    if base_mean <= 0:
        return Interval(0.0, None, None, "no base step time")
    change = 100.0 * (new_mean - base_mean) / base_mean
    squares = sum((m - statistics.fmean(side)) ** 2 for side in (base_means, new_means) if len(side) >= 2 for m in side)
    spread = max(math.sqrt(squares / df), run_noise_pct / 100.0 * base_mean)
    half = student_t_quantile(0.5 + confidence / 2, df) * spread * math.sqrt(1 / len(base) + 1 / len(new))
    scale = 100.0 / base_mean
    return Interval(
        change,
        max(change - half * scale, -100.0),  # step times are positive: no mean falls by more than 100 %
        change + half * scale,
        f"Student's t interval over run means, {confidence:.0%}, df={df}, {len(base)} and {len(new)} runs, "
        f"run-to-run spread {100.0 * spread / base_mean:.1f} % (at least {run_noise_pct:g} %)",
    )
