"""How busy the machine was while a run was recorded, as the manifest's ``environment.contention`` record
(written by capture/machine.py) tells it: the thresholds the rules and ``diff`` read it with, in one place."""

from __future__ import annotations

from typing import Optional

# Other processes used more than this share of the CPUs the run may use: its timings carry their load.
OTHERS_BUSY_SHARE = 0.25
# A 1-minute load average above the CPU count by more than this: more runnable threads than CPUs.
OVERSUBSCRIBED_BY = 0.5


def oversubscribed(load_average: Optional[float], cpus: Optional[float]) -> bool:
    """Whether the machine ran more threads than it has CPUs (False when either figure is unknown)."""
    if load_average is None or not cpus:
        return False
    return load_average > cpus + OVERSUBSCRIBED_BY
