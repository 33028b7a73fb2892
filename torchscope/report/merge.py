"""Combine per-span results into run-level figures (pure functions, no I/O)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from torchscope.report.model import DeviceSummary, KernelRow, MemorySummary


def weighted_signals(items: Sequence[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    """Merge signal dicts: numbers -> weighted mean, dicts -> merged per key, lists -> ordered union,
    other values -> the most common one. Weights are the spans' step counts."""
    keys: list[str] = []
    for signals, _ in items:
        keys.extend(k for k in signals if k not in keys)
    merged: dict[str, Any] = {}
    for key in keys:
        present = [(s[key], w) for s, w in items if key in s]
        first = present[0][0]
        if isinstance(first, bool) or not isinstance(first, (int, float, dict, list)):
            merged[key] = Counter(str(v) for v, _ in present).most_common(1)[0][0] if not isinstance(first, bool) else any(v for v, _ in present)
        elif isinstance(first, (int, float)):
            total = sum(w for _, w in present)
            values = [float(v) for v, _ in present]
            merged[key] = sum(v * w for v, (_, w) in zip(values, present)) / total if total else sum(values) / len(values)
        elif isinstance(first, dict):
            merged[key] = _merge_numeric_dicts([(v, w) for v, w in present if isinstance(v, dict)])
        else:
            seen: list[Any] = []
            for value, _ in present:
                seen.extend(x for x in value if x not in seen)
            merged[key] = seen
    return merged


def _merge_numeric_dicts(items: list[tuple[dict[str, Any], float]]) -> dict[str, Any]:
    if all(all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in d.values()) for d, _ in items):
        total = sum(w for _, w in items) or 1.0
        out: dict[str, float] = {}
        for values, weight in items:
            for name, value in values.items():
                out[name] = out.get(name, 0.0) + float(value) * weight / total
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
    return weighted_signals(items)


def merge_kernel_rows(tables: list[list[KernelRow]]) -> list[KernelRow]:
    merged: dict[str, KernelRow] = {}
    occupancy_weight: dict[str, float] = {}
    for rows in tables:
        for row in rows:
            seen = merged.get(row.name)
            if seen is None:
                merged[row.name] = KernelRow(**{f: getattr(row, f) for f in row.__struct_fields__})
                occupancy_weight[row.name] = row.total_us if row.mean_occupancy_pct is not None else 0.0
                continue
            if row.mean_occupancy_pct is not None:
                w0 = occupancy_weight[row.name]
                w1 = row.total_us
                base = seen.mean_occupancy_pct if seen.mean_occupancy_pct is not None else 0.0
                seen.mean_occupancy_pct = (base * w0 + row.mean_occupancy_pct * w1) / (w0 + w1) if w0 + w1 else None
                occupancy_weight[row.name] = w0 + w1
            seen.calls += row.calls
            seen.total_us += row.total_us
            seen.min_us = min(seen.min_us, row.min_us)
            seen.max_us = max(seen.max_us, row.max_us)
            seen.mean_us = seen.total_us / seen.calls
            seen.tensor_core = seen.tensor_core or row.tensor_core
    return sorted(merged.values(), key=lambda r: -r.total_us)


_WEIGHTED_DEVICE_FIELDS = (
    "utilization",
    "sm_efficiency",
    "achieved_occupancy_pct",
    "tensor_core_kernel_share",
    "tensor_core_eligible_share",
    "kernels_per_step",
    "median_kernel_us",
)


def merge_device(items: list[tuple[DeviceSummary, float]]) -> DeviceSummary:
    """Weighted (by traced step time) mean of each figure over the spans that have it."""
    present = [(d, w) for d, w in items if d.present]
    if not present:
        return items[0][0] if items else DeviceSummary()
    first = present[0][0]
    out = DeviceSummary(
        present=True,
        name=first.name,
        compute_capability=first.compute_capability,
        total_memory_bytes=first.total_memory_bytes,
    )
    for name in _WEIGHTED_DEVICE_FIELDS:
        values = [(getattr(d, name), w) for d, w in present if getattr(d, name) is not None]
        total = sum(w for _, w in values)
        if values:
            mean = sum(v * w for v, w in values) / total if total else sum(v for v, _ in values) / len(values)
            setattr(out, name, float(mean))
    return out


def merge_memory(items: list[MemorySummary]) -> MemorySummary:
    out = MemorySummary()
    for memory in items:
        if not memory.present:
            continue
        out.present = True
        for label, peak in memory.peak_allocated_bytes.items():
            out.peak_allocated_bytes[label] = max(peak, out.peak_allocated_bytes.get(label, 0))
        for label, peak in memory.peak_reserved_bytes.items():
            out.peak_reserved_bytes[label] = max(peak, out.peak_reserved_bytes.get(label, 0))
        for label, series in memory.timeline.items():
            out.timeline.setdefault(label, series)
    return out
