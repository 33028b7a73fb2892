"""The kernel table and the device summary (utilisation, SM efficiency, occupancy, tensor cores), per
span and combined over the run: kernel rows summed by name, device figures weighted by step time."""

from __future__ import annotations

from typing import Any

import msgspec

from torchscope.analysis.reduce import weighted_mean
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.report.model import DeviceSummary, KernelRow


class KernelTable(msgspec.Struct, kw_only=True):
    rows: list[KernelRow]


def extract_kernels(span: SpanInput) -> KernelTable:
    return KernelTable(rows=span.device.kernel_rows)


def reduce_kernels(parts: list[Part[KernelTable]]) -> dict[str, Any]:
    return {"kernels": merge_kernel_rows([p.value.rows for p in parts])}


def merge_kernel_rows(tables: list[list[KernelRow]]) -> list[KernelRow]:
    """Rows of the same kernel name summed (occupancy weighted by kernel time); longest total first."""
    merged: dict[str, KernelRow] = {}
    occupancy_weight: dict[str, float] = {}
    for rows in tables:
        for row in rows:
            seen = merged.get(row.name)
            if seen is None:
                merged[row.name] = msgspec.structs.replace(row)
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


def extract_device(span: SpanInput) -> DeviceSummary:
    return span.device.summary


_WEIGHTED_DEVICE_FIELDS = (
    "utilization",
    "sm_efficiency",
    "achieved_occupancy_pct",
    "tensor_core_kernel_share",
    "tensor_core_eligible_share",
    "kernels_per_step",
    "median_kernel_us",
)


def reduce_device(parts: list[Part[DeviceSummary]]) -> dict[str, Any]:
    """Each figure's mean over the spans that have it, weighted by their step time."""
    present = [(p.value, p.key.step_us) for p in parts if p.value.present]
    if not present:
        return {"device": parts[0].value if parts else DeviceSummary()}
    first = present[0][0]
    out = DeviceSummary(
        present=True,
        name=first.name,
        compute_capability=first.compute_capability,
        total_memory_bytes=first.total_memory_bytes,
    )
    for summary, _ in present:  # the same id on two ranks is two GPUs: keep the smaller capacity
        for device_id, capacity in summary.memory_bytes_by_id.items():
            out.memory_bytes_by_id[device_id] = min(capacity, out.memory_bytes_by_id.get(device_id, capacity))
    for name in _WEIGHTED_DEVICE_FIELDS:
        values = [(getattr(d, name), w) for d, w in present if getattr(d, name) is not None]
        if values:
            setattr(out, name, float(weighted_mean([v for v, _ in values], [w for _, w in values])))
    return {"device": out}


KERNELS = Analysis(name="kernels", extract=extract_kernels, extract_type=KernelTable, reduce=reduce_kernels, fills=("kernels",))
DEVICE = Analysis(name="device", extract=extract_device, extract_type=DeviceSummary, reduce=reduce_device, fills=("device",))
