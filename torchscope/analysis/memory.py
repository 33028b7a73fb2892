"""Memory timeline from `[memory]` instant events (recorded with `profile_memory=True`).

Each event carries the allocation size (`Bytes`) and, since PyTorch 1.10, the device's running totals
(`Total Allocated`, `Total Reserved`). The timeline is the allocated total per device, thinned to at most
`MAX_POINTS` points (keeping each bucket's maximum, so the peak is never lost). Over a run, peaks are the
maximum over spans and ranks; the timeline is the first span's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.arrays import distinct
from torchscope.report.model import MemorySummary
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

MAX_POINTS = 400
DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda"}


def device_label(device_type: int, device_id: int) -> str:
    kind = DEVICE_TYPE_NAMES.get(device_type, f"device{device_type}")
    return kind if device_id < 0 else f"{kind}:{device_id}"


def memory_summary(events: EventTable, origin_us: float) -> MemorySummary:
    mem = np.flatnonzero(events.kind == Kind.MEMORY)
    summary = MemorySummary()
    if mem.size == 0:
        return summary
    summary.present = True
    key = events.device_type[mem] * 4096 + (events.device_id[mem] + 1)  # device_id -1 = host
    for k in distinct(key).tolist():
        mine = mem[key == k]
        mine = mine[np.argsort(events.ts_us[mine], kind="stable")]
        label = device_label(int(k // 4096), int(k % 4096) - 1)
        allocated = events.total_allocated[mine]
        if (allocated < 0).any():
            # PyTorch <= 1.9 recorded only each allocation's size: the running sum is the allocated
            # total relative to the start of the capture.
            allocated = np.cumsum(events.mem_bytes[mine])
            allocated = allocated - min(int(allocated.min()), 0)
        summary.peak_allocated_bytes[label] = int(allocated.max())
        reserved = events.total_reserved[mine]
        if (reserved >= 0).any():
            summary.peak_reserved_bytes[label] = int(reserved.max())
        summary.timeline[label] = _thin(events.ts_us[mine] - origin_us, allocated)
    return summary


def _thin(t: np.ndarray, values: np.ndarray) -> list[list[float]]:
    if t.size <= MAX_POINTS:
        return [[float(a), float(b)] for a, b in zip(t, values)]
    buckets = np.array_split(np.arange(t.size), MAX_POINTS)
    out = []
    for bucket in buckets:
        best = bucket[np.argmax(values[bucket])]
        out.append([float(t[best]), float(values[best])])
    return out


def extract_memory(span: SpanInput) -> MemorySummary:
    steps = span.steps
    origin = float(steps.start_us[0]) if len(steps) else float(span.events.ts_us.min(initial=0.0))
    return memory_summary(span.events, origin)


def reduce_memory(parts: list[Part[MemorySummary]]) -> dict[str, Any]:
    out = MemorySummary()
    for memory in (p.value for p in parts):
        if not memory.present:
            continue
        out.present = True
        for label, peak in memory.peak_allocated_bytes.items():
            out.peak_allocated_bytes[label] = max(peak, out.peak_allocated_bytes.get(label, 0))
        for label, peak in memory.peak_reserved_bytes.items():
            out.peak_reserved_bytes[label] = max(peak, out.peak_reserved_bytes.get(label, 0))
        for label, series in memory.timeline.items():
            out.timeline.setdefault(label, series)
    return {"memory": out}


MEMORY = Analysis(name="memory", extract=extract_memory, extract_type=MemorySummary, reduce=reduce_memory, fills=("memory",))
