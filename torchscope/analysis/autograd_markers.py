"""The host time covered by forward and backward markers (`markers.phase_masks`: `torchscope:forward`,
DDP's forward, the autograd engine's functions), once per table: memory's churn leaves out what happens
inside them, and the what-if optimizer cause leaves out a closure's forward and backward."""

from __future__ import annotations

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import phase_masks
from torchscope.trace.tables import EventTable


def autograd_marker_set(events: EventTable) -> intervals.IntervalSet:
    """The union of the forward and backward markers' intervals (the phase masks mark host ranges only)."""

    def compute() -> intervals.IntervalSet:
        masks = phase_masks(events)
        marked = np.flatnonzero(masks["forward"] | masks["backward"])
        start = events.ts_us[marked]
        return intervals.union(start, start + events.dur_us[marked])

    return events.memo("autograd_marker_set", compute)
