"""The DataLoader's worker processes restarted every epoch, from the capture's step clock.

Without ``persistent_workers=True`` a multi-process DataLoader starts its workers when an epoch's
iteration begins and shuts them down when it ends: tens of milliseconds each time (a fork, the workers'
first batch, the joins), in one step of every epoch. The 3 recorded steps rarely hold it; the step clock
times it in the unprofiled steps (capture/overhead.py, ``FetchTimer``): the manifest's
``environment.step_times.unprofiled_loader_restart_us`` (per unprofiled step), the part of it in the
restarted iterators' first fetch (``unprofiled_loader_first_fetch_us``: the workers' boot and the first
batch, which persistent workers would still load) and ``unprofiled_loader_restarts``.
"""

from __future__ import annotations

from typing import Any

from torchscope.report.model import Report


def from_step_clock(report: Report) -> None:
    """Fill the run-level worker-restart figures of `report.measurements.dataloader` (left at 0 steps when
    the capture did not time any: a bare trace, no multi-process DataLoader, persistent workers)."""
    environment = report.run.manifest.get("environment")
    times = environment.get("step_times") if isinstance(environment, dict) else None
    if not isinstance(times, dict):
        return
    steps, restart = _numbers(times.get("unprofiled_step_us")), _numbers(times.get("unprofiled_loader_restart_us"))
    first = _numbers(times.get("unprofiled_loader_first_fetch_us"))
    restarts = times.get("unprofiled_loader_restarts")
    if not steps or len(restart) != len(steps) or not isinstance(restarts, int) or isinstance(restarts, bool):
        return
    section = report.measurements.dataloader
    n = len(steps)
    section.unprofiled_steps = float(n)
    section.unprofiled_step_mean_us = sum(steps) / n
    section.worker_restarts_per_step = max(restarts, 0) / n
    section.restart_us_per_step = sum(restart) / n
    section.restart_first_fetch_us_per_step = sum(first) / n if len(first) == n else 0.0
    # All a turnover step costs (the iterator's set-up and teardown around the timed calls too): its time
    # beyond the median of the steps without one.
    others = sorted(step for step, turnover in zip(steps, restart) if turnover <= 0)
    if others:
        typical = others[len(others) // 2]
        section.restart_step_excess_us_per_step = sum(max(step - typical, 0.0) for step, turnover in zip(steps, restart) if turnover > 0) / n


def _numbers(values: Any) -> list[float]:
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
        return []
    return [float(v) for v in values]
