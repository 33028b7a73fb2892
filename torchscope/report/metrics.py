"""The run's headline figures as a flat list of metrics (name, value, unit, which direction is better),
computed once from a finished Report: what `diff`, a regression gate and `tune` compare.

Names are stable identifiers (`step_time.mean_us`, `breakdown.kernel_us`, `sync.us_per_step`, ...);
a metric that the trace cannot support (no steps, no device, no memory events) is left out rather
than reported as zero.
"""

from __future__ import annotations

import math

from torchscope.report.model import Direction, Metric, Report, Unit


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def _pstdev(values: list[float]) -> float:
    """Population standard deviation (as statistics.pstdev, in floats: that module's exact fractions
    and its imports are not needed for a figure reported to a few digits)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def metrics_of(report: Report) -> list[Metric]:
    """Every metric the report supports, in a fixed order."""
    out: list[Metric] = []

    def add(name: str, value: float | None, unit: Unit, better: Direction) -> None:
        if value is not None and math.isfinite(value):
            out.append(Metric(name=name, value=float(value), unit=unit, better=better))

    durations = [s.duration_us for s in report.steps]
    if durations and report.run.step_source == "profiler_step":
        mean = report.mean_step_us
        add("step_time.mean_us", mean, "us", "lower")
        add("step_time.median_us", _median(durations), "us", "lower")
        add("step_time.max_us", max(durations), "us", "lower")
        add("step_time.stdev_us", _pstdev(durations), "us", "lower")
        add("throughput.steps_per_s", 1e6 / mean if mean > 0 else None, "per_second", "higher")
    for category, time in report.breakdown.items():
        add(f"breakdown.{category}_us", time.us, "us", "lower")
    for category, time in report.phases.items():
        add(f"phases.{category}_us", time.us, "us", "lower")
    device = report.device
    if device.present:
        add("device.utilization", device.utilization, "fraction", "higher")
        add("device.sm_efficiency", device.sm_efficiency, "fraction", "higher")
        add("device.achieved_occupancy_pct", device.achieved_occupancy_pct, "percent", "higher")
        add("device.tensor_core_kernel_share", device.tensor_core_kernel_share, "fraction", "higher")
        add("device.kernels_per_step", device.kernels_per_step, "count", "none")
        add("idle.us_per_step", report.measurements.idle.idle_us_per_step, "us", "lower")
    for label, peak in report.memory.peak_allocated_bytes.items():
        add(f"memory.peak_allocated_bytes.{label}", peak, "bytes", "lower")
    for label, peak in report.memory.peak_reserved_bytes.items():
        add(f"memory.peak_reserved_bytes.{label}", peak, "bytes", "lower")
    m = report.measurements
    add("sync.per_step", m.sync.syncs_per_step, "count", "lower")
    add("sync.us_per_step", m.sync.sync_us_per_step, "us", "lower")
    add("copies.pageable_htod_us_per_step", m.copies.pageable_htod_us_per_step, "us", "lower")
    add("optimizer.step_us_per_step", m.optimizer.step_us_per_step, "us", "lower")
    add("dispatch.python_gap_us_per_step", m.dispatch.python_gap_us_per_step, "us", "lower")
    add("compile.compilation_us_per_step", m.compile.compilation_us_per_step, "us", "lower")
    add("compile.recompilation_us_per_step", m.compile.recompilation_us_per_step, "us", "lower")
    ranks = [r.mean_step_us for r in report.ranks if r.steps > 0]
    if len(ranks) > 1:
        add("ranks.step_time_spread", (max(ranks) - min(ranks)) / (math.fsum(ranks) / len(ranks)), "fraction", "lower")
    across = report.distributed  # collectives matched across ranks (docs/distributed.md)
    if across.present and across.matched:
        add("collectives.wait_us_per_step", across.wait_us_per_step, "us", "lower")
        add("collectives.exposed_transfer_us_per_step", across.exposed_transfer_us_per_step, "us", "lower")
        add("straggler.median_lateness_us", across.straggler.median_lateness_us if across.straggler else 0.0, "us", "lower")
    return out
