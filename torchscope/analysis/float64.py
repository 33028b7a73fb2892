"""Operators computing in float64 (double), from the input types the profiler records with shapes.

float64 halves the SIMD width of a CPU and runs at a fraction of float32's rate on a GPU (1/2 on data-centre
parts, 1/32-1/64 on most others, and no tensor cores for it outside a few); `torch.set_default_dtype(
torch.float64)`, `model.double()` or tensors made from NumPy arrays (float64 by default) put a model there,
often by accident. An operator counts when one of its tensor inputs is double (or complex double); its time
is what it spends itself: host self time on a CPU, the device time of the kernels it launched on a GPU
(a composite op and its children are each counted once). Without recorded shapes the types are not in the
trace: nothing is measured.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import Float64
from torchscope.trace.tables import EventTable

DOUBLE_TYPES = frozenset({"double", "c10::complex<double>"})
MAX_OPS = 5


def _has_double(types: str) -> bool:
    """Whether a recorded "Input type" list names a double tensor."""
    if "double" not in types:  # the common case, without parsing
        return False
    try:
        parsed = msgspec.json.decode(types)
    except (msgspec.DecodeError, ValueError):
        return False
    return isinstance(parsed, list) and any(t in DOUBLE_TYPES for t in parsed if isinstance(t, str))


def _typed_and_double(events: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether the op has recorded input types, and whether one is a double tensor (each test runs
    once per distinct type list; an absent list may be either "no string" or the empty text)."""
    ids, slot = group_ids(events.input_type[rows])
    texts = [events.strings[i] for i in ids.tolist()]
    typed = np.fromiter((t not in ("", "[]") for t in texts), bool, ids.size)
    double = np.fromiter((_has_double(t) for t in texts), bool, ids.size)
    return typed[slot], double[slot]


def float64_ops(span: SpanInput) -> Float64 | None:
    """The ops in the steps that compute in float64, and their time per step (None: no step, or no op
    with recorded input types)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    times = span.times
    ops = np.flatnonzero(times.op_mask & (event_steps(events, steps) >= 0))
    has_types, has_double = _typed_and_double(events, ops)
    if not has_types.any():
        return None
    typed, double = ops[has_types], ops[has_double]
    own_us = times.device_self_us if span.has_device else times.host_self_us
    n = len(steps)
    names, slot = group_ids(events.name[double])
    by_name = np.bincount(slot, own_us[double], names.size) if double.size else np.zeros(0)
    top = np.argsort(-by_name, kind="stable")[:MAX_OPS]
    return Float64(
        time_base="device" if span.has_device else "host",
        ops_per_step=double.size / n,
        float64_us_per_step=float(own_us[double].sum()) / n,
        typed_ops_us_per_step=float(own_us[typed].sum()) / n,
        by_op={events.strings[int(names[i])]: float(by_name[i]) / n for i in top.tolist() if by_name[i] > 0},
    )
