"""The compute phases' spread over the unprofiled steps, from the capture's phase clock.

The step clock times each phase range the hooks open (forward, backward, optimizer) in every step the
profiler does not record (``environment.step_times.unprofiled_phase_us``, capture/overhead.py). A phase
that does the same work every step takes about the same time; where other threads want the same cores
(DataLoader workers beside compute's intra-op threads, another process) most steps take longer than the
few in which it ran alone. The fastest tenth of the steps stands for the phase running alone, the median
for what it usually took: their difference, summed over the compute phases, is time lost to contention
(or to work that varies from step to step: the rules that read it check for a cause).
"""

from __future__ import annotations

from typing import TypeGuard

import numpy as np

from torchscope.analysis.overhead import phase_times, step_times
from torchscope.report.model import Report

COMPUTE_PHASES = ("forward", "backward", "optimizer")
MIN_STEPS = 10  # fewer clocked steps have no meaningful fastest tenth
FAST_PERCENTILE = 10


def from_step_clock(report: Report) -> None:
    """Fill `report.measurements.phase_clock` (left at 0 steps without at least MIN_STEPS clocked steps)."""
    unprofiled, _, _ = step_times(report.run.manifest)
    if len(unprofiled) < MIN_STEPS:
        return
    clocked = phase_times(report.run.manifest, len(unprofiled))
    # Each phase over the steps it ran in (an optimizer stepping every other step is no contention), where
    # it ran in at least half of them.
    phases = {name: us[us > 0] for name, us in clocked.items() if name in COMPUTE_PHASES and (us > 0).sum() * 2 >= us.size}
    if not phases:
        return
    section = report.measurements.phase_clock
    section.unprofiled_steps = float(len(unprofiled))
    section.step_median_us = float(np.median(unprofiled))
    section.median_us = {name: float(np.median(us)) for name, us in phases.items()}
    section.fastest_us = {name: float(np.percentile(us, FAST_PERCENTILE, method="lower")) for name, us in phases.items()}
    section.excess_us_per_step = sum(section.median_us[name] - section.fastest_us[name] for name in phases)
    environment = report.run.manifest.get("environment")
    environment = environment if isinstance(environment, dict) else {}
    times = environment.get("step_times")
    rest = times.get("rest_cpu_per_wall") if isinstance(times, dict) else None
    if _positive(rest):
        section.compute_cpu_per_wall = float(rest)
    # The process tree's CPU beyond the training process's own, over the recorded window: its children,
    # the DataLoader workers (a worker waiting on I/O uses next to none).
    contention = environment.get("contention")
    contention = contention if isinstance(contention, dict) else {}
    own, process, wall = contention.get("own_cpu_s"), contention.get("process_cpu_s"), contention.get("wall_s")
    if _positive(own) and _positive(process) and _positive(wall):
        section.children_cpu_per_wall = max(float(own) - float(process), 0.0) / float(wall)


def _positive(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
