"""What a thinned trace records about the Python-function events it dropped (capture/thinning.py).

A trace over its size budget loses its shortest ``python_function`` events at capture; its header then
holds, under :data:`HEADER_KEY`, the budget, the sizes, the counts, the threshold, the dropped events'
total time and where they started (counts per :data:`BIN_US` bin from ``dropped_origin_us``), so the
analysis can still count every recorded Python call per phase.
"""

from __future__ import annotations

from typing import Any

import numpy as np

HEADER_KEY = "torchscopeThinning"  # top-level key of a thinned trace (the trace reader keeps small headers)
BIN_US = 100.0  # resolution of the dropped events' start times: well under any phase of a training step


def dropped_starts(header: dict[str, Any]) -> np.ndarray:
    """The dropped events' start times (each bin's middle, repeated by its count) from a trace header;
    empty for a trace that was not thinned."""
    summary = header.get(HEADER_KEY)
    if not isinstance(summary, dict):
        return np.zeros(0)
    try:
        bins = np.asarray(summary.get("dropped_bins") or [], dtype=np.float64)
        counts = np.asarray(summary.get("dropped_counts") or [], dtype=np.int64)
        width = float(summary.get("dropped_bin_us", BIN_US))
        origin = float(summary.get("dropped_origin_us", 0.0))
    except (TypeError, ValueError):
        return np.zeros(0)
    if bins.shape != counts.shape or (counts < 0).any():
        return np.zeros(0)
    return np.repeat(origin + (bins + 0.5) * width, counts)
