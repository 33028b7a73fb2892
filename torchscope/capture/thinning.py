"""Keep a trace within its size budget by dropping the shortest Python-function events (issue 13).

With ``with_stack`` torch's Python tracer records every Python call. A Python-heavy input pipeline (a
pure-Python ``__getitem__`` calling small helpers per element) then makes almost all of the trace: 155-278
MB for 3 steps, 507k of 526k events ``python_function``. Kineto has no depth or duration limit for that
tracer (``_ExperimentalConfig`` only toggles its output fields), so the bound is applied to the exported
file, before it is renamed into place:

* Only ``python_function`` events are dropped, the shortest first: every kept event has a duration above
  the threshold and so do all its ancestors (a caller lasts at least as long as its callee), so the kept
  call tree stays whole and each kept frame's inclusive time is unchanged. Garbage collections and anomaly
  mode's saved stacks are kept whatever their length: they are findings' evidence, a few per step. Operators, ranges
  (``ProfilerStep#``, ``torchscope:*``, the DataLoader's fetch), memory and device events are all kept:
  the phase shares, which are read from them, do not move.
* What was dropped is recorded in the trace's header (:data:`HEADER_KEY`): the budget, the sizes, the
  counts, the threshold, the dropped events' total time, and where they started (counts per
  :data:`BIN_US` bin), so the overhead correction (analysis/overhead.py) still counts every recorded
  Python call per phase, and the report says what was dropped (``trace_quality.trace_thinned``).

Runs in the profiler's ``step()`` at the end of a window, where the export already happens; only a trace
over its budget is read back (msgspec: about 1-2 s for 250 MB).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np

from torchscope.rundir.thinning import BIN_US, HEADER_KEY

FILL = 0.9  # aim below the budget: re-encoding is compact, but the estimate per event is an average
MB = 1 << 20


def thin_trace(path: Path, budget_bytes: int) -> Optional[dict[str, Any]]:
    """Rewrite the Chrome trace at ``path`` within ``budget_bytes`` if it is larger (0: no budget).

    Returns what was dropped (also written into the trace under :data:`HEADER_KEY`), None when the trace
    was within its budget or holds no Python-function events to drop. Raises ``OSError`` or
    ``msgspec.DecodeError`` on a file that cannot be read back: the caller keeps the trace as it is."""
    size = path.stat().st_size
    if budget_bytes <= 0 or size <= budget_bytes:
        return None
    trace = msgspec.json.decode(path.read_bytes())
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return None
    python = np.array([isinstance(e, dict) and e.get("cat") == "python_function" for e in events], dtype=bool)
    rows = np.flatnonzero(python)
    if rows.size == 0:
        return None
    # A call without a usable duration goes first (a NaN would sort above every real one).
    dur = np.nan_to_num(np.array([_number(events[i].get("dur")) for i in rows], dtype=np.float64), nan=0.0)
    ts = np.array([_number(events[i].get("ts")) for i in rows], dtype=np.float64)
    python_bytes = _sampled_bytes(events, rows)
    other_bytes = len(msgspec.json.encode([e for e, p in zip(events, python) if not p]))
    room = max(FILL * budget_bytes - other_bytes, 0.0)
    keep_count = int(min(rows.size, room // max(python_bytes, 1.0)))
    # The keep_count-th longest duration is the threshold; keeping only longer ones keeps callers with callees.
    threshold = float(np.sort(dur)[::-1][keep_count - 1]) if keep_count > 0 else float("inf")
    keep = dur > threshold if keep_count < rows.size else np.ones(rows.size, dtype=bool)
    keep |= np.array([_always_kept(events[i].get("name")) for i in rows], dtype=bool)
    dropped = ~keep
    if not dropped.any():
        return None
    drop_rows = set(rows[dropped].tolist())
    trace["traceEvents"] = [e for i, e in enumerate(events) if i not in drop_rows]
    starts = ts[dropped]
    starts = starts[np.isfinite(starts)]
    origin = float(starts.min()) if starts.size else 0.0
    bins, counts = np.unique(np.floor((starts - origin) / BIN_US).astype(np.int64), return_counts=True)
    summary: dict[str, Any] = {
        "budget_mb": budget_bytes / MB,
        "bytes_before": size,
        "python_events": int(rows.size),
        "python_events_dropped": int(dropped.sum()),
        "kept_longer_than_us": threshold,
        "dropped_us": float(np.nansum(dur[dropped])),
        "dropped_bin_us": BIN_US,
        "dropped_origin_us": origin,
        "dropped_bins": bins.tolist(),
        "dropped_counts": counts.tolist(),
    }
    trace[HEADER_KEY] = summary
    data = msgspec.json.encode(trace)
    summary["bytes_after"] = len(data)  # the header's own figure is the only one written before the size is known
    tmp = path.with_name(path.name + ".thin")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a disk that filled up keeps the whole trace, and no half-written copy
        raise
    return summary


def _always_kept(name: Any) -> bool:
    """Short events that are a finding's evidence, not calls of the pipeline: each garbage collection
    (host_overhead.gc_pauses) and each stack anomaly mode saves (host_overhead.anomaly_mode). A few per
    step, leaves or whole frames: the kept tree and its inclusive times stay as they were."""
    return isinstance(name, str) and (name == "Python GC" or (name.endswith("): format_stack") and "fx/traceback.py(" in name))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def _sampled_bytes(events: list[Any], rows: np.ndarray, sample: int = 2000) -> float:
    """Encoded bytes per Python-function event, from an even sample of them (plus the separating comma)."""
    picked = rows[:: max(rows.size // sample, 1)]
    return len(msgspec.json.encode([events[i] for i in picked])) / picked.size + 1.0
