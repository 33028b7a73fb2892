"""Operator table (host self/total time, device self/total time, calls; optionally by input shape) and
the table of `record_function` ranges.

Host self time = duration minus the direct children (ops, ranges, runtime calls). Device time of an op =
the device work launched by runtime calls under it (matched by correlation id); "self" counts what the op
launched directly, "total" includes its children's.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis.flops import event_flops
from torchscope.analysis.markers import own_marker_mask
from torchscope.analysis.nesting import (
    HostTree,
    accumulate_up,
    launcher_of_device_events,
    nearest_ancestor_of,
    self_time_us,
)
from torchscope.analysis.steps import step_name_mask
from torchscope.arrays import group_ids, group_pairs
from torchscope.report.model import OperatorRow, RangeRow
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable

# Python frames count as children, as in PyTorch's own tables (key_averages): an op that runs Python (an
# autograd.Function, checkpoint's hooks, aot_autograd's `CompiledFunction`) does not keep that Python's time,
# nor the time of the ops the Python calls.
_SELF_TIME_CHILDREN = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER)


class OpTimes(msgspec.Struct, frozen=True):
    """Per-event host/device times for CPU ops (arrays over all events; zero for others)."""

    op_mask: np.ndarray
    host_self_us: np.ndarray
    device_self_us: np.ndarray
    device_total_us: np.ndarray
    launching_op: np.ndarray  # per event: nearest enclosing CPU op (-1 if none)


def op_times(events: EventTable, tree: HostTree) -> OpTimes:
    is_step = step_name_mask(events)
    op_mask = (events.kind == Kind.CPU_OP) & ~is_step
    child_mask = events.kind_mask(_SELF_TIME_CHILDREN) & ~is_step
    host_self = self_time_us(events.dur_us, tree.parent, child_mask)
    launching_op = nearest_ancestor_of(tree, op_mask)
    device = events.kind_rows(DEVICE_KINDS)
    launcher = launcher_of_device_events(events, device)
    owner = np.where(launcher >= 0, launching_op[np.maximum(launcher, 0)], -1)
    device_self = np.zeros(len(events))
    np.add.at(device_self, owner[owner >= 0], events.dur_us[device][owner >= 0])
    device_total = accumulate_up(tree, device_self)
    return OpTimes(op_mask, host_self, device_self, device_total, launching_op)


def operator_rows(events: EventTable, times: OpTimes, by_shape: bool = False, flops: np.ndarray | None = None) -> list[OperatorRow]:
    """Totals per operator name (or name and input shapes); `flops`: `event_flops` of the ops of
    `times.op_mask`, when the caller has them (the two tables of a span share them)."""
    ops = np.flatnonzero(times.op_mask)
    if ops.size == 0:
        return []
    # By shape: (name << 32 | shapes) keys, grouped through the ranks of each column rather than sorted.
    unique, group = group_pairs(events.name[ops], events.input_dims[ops]) if by_shape else group_ids(events.name[ops])
    sums = {
        "calls": np.bincount(group, minlength=unique.size),
        "host_self_us": np.bincount(group, times.host_self_us[ops], unique.size),
        "host_total_us": np.bincount(group, events.dur_us[ops], unique.size),
        "device_self_us": np.bincount(group, times.device_self_us[ops], unique.size),
        "device_total_us": np.bincount(group, times.device_total_us[ops], unique.size),
    }
    flops = event_flops(events, ops) if flops is None else flops
    known = np.bincount(group, np.isfinite(flops), unique.size) > 0
    flops_sum = np.bincount(group, np.nan_to_num(flops, nan=0.0), unique.size)
    rows = []
    for g, k in enumerate(unique.tolist()):
        rows.append(
            OperatorRow(
                name=events.strings[k >> 32 if by_shape else k],
                calls=int(sums["calls"][g]),
                host_self_us=float(sums["host_self_us"][g]),
                host_total_us=float(sums["host_total_us"][g]),
                device_self_us=float(sums["device_self_us"][g]),
                device_total_us=float(sums["device_total_us"][g]),
                input_shapes=events.strings[k & 0xFFFFFFFF] if by_shape else None,
                flops=float(flops_sum[g]) if known[g] else None,
            )
        )
    return rows


def range_rows(events: EventTable) -> list[RangeRow]:
    """User `record_function` ranges (not ProfilerStep markers nor torchscope's own phase labels)."""
    own = own_marker_mask(events)
    ranges = np.flatnonzero((events.kind == Kind.USER_ANNOTATION) & ~own)
    if ranges.size == 0:
        return []
    unique, group = group_ids(events.name[ranges])
    calls = np.bincount(group, minlength=unique.size)
    total = np.bincount(group, events.dur_us[ranges], unique.size)
    return [
        RangeRow(name=events.strings[k], calls=int(c), total_us=float(t), mean_us=float(t / c))
        for k, c, t in zip(unique.tolist(), calls.tolist(), total.tolist())
    ]


def merge_operator_rows(tables: list[list[OperatorRow]]) -> list[OperatorRow]:
    """Sum rows with the same (name, shapes) across spans and ranks; sorted by host self time."""
    merged: dict[tuple[str, str | None], OperatorRow] = {}
    for rows in tables:
        for row in rows:
            key = (row.name, row.input_shapes)
            seen = merged.get(key)
            if seen is None:
                merged[key] = OperatorRow(**{f: getattr(row, f) for f in row.__struct_fields__})
                continue
            seen.calls += row.calls
            seen.host_self_us += row.host_self_us
            seen.host_total_us += row.host_total_us
            seen.device_self_us += row.device_self_us
            seen.device_total_us += row.device_total_us
            if row.flops is not None:
                seen.flops = (seen.flops or 0.0) + row.flops
    return sorted(merged.values(), key=lambda r: (-(r.device_self_us + r.host_self_us), r.name))


def merge_range_rows(tables: list[list[RangeRow]]) -> list[RangeRow]:
    merged: dict[str, RangeRow] = {}
    for rows in tables:
        for row in rows:
            seen = merged.setdefault(row.name, RangeRow(name=row.name, calls=0, total_us=0.0, mean_us=0.0))
            seen.calls += row.calls
            seen.total_us += row.total_us
    for row in merged.values():
        row.mean_us = row.total_us / row.calls if row.calls else 0.0
    return sorted(merged.values(), key=lambda r: -r.total_us)
