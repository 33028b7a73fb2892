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

from torchscope.analysis.patterns import by_dims_and_types
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import Float64
from torchscope.trace.tables import EventTable

DOUBLE_TYPES = frozenset({"double", "c10::complex<double>"})
# Dtype conversions read a double tensor to make another dtype (the fix itself: `from_numpy(a).float()`).
CONVERSIONS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_", "aten::lift_fresh", "aten::lift_fresh_copy"})
MAX_OPS = 5


def _has_double(types: str, dims: str = "") -> bool:
    """Whether the recorded "Input type" list names a double tensor that is not a 0-dim scalar: torch wraps
    a Python number (`x * 0.5`, `a / math.sqrt(d)`) in a 0-dim double tensor, recorded with dims `[]`, and
    computes in the other operand's dtype. Without recorded dims every double counts."""
    if "double" not in types:  # the common case, without parsing
        return False
    try:
        parsed = msgspec.json.decode(types)
        shapes = msgspec.json.decode(dims) if dims else None
    except (msgspec.DecodeError, ValueError):
        return False
    if not isinstance(parsed, list):
        return False
    if not isinstance(shapes, list) or len(shapes) != len(parsed):
        shapes = [None] * len(parsed)
    return any(t in DOUBLE_TYPES and shape != [] for t, shape in zip(parsed, shapes) if isinstance(t, str))


def _double_input(dims: str, types: str) -> bool:
    return _has_double(types, dims)


def _is_conversion(name: str) -> bool:
    return name in CONVERSIONS


def _typed_and_double(events: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether the op has recorded input types, and whether one is a double tensor that is not a
    0-dim scalar. Each type list is read once; the dims only for the few lists that name a double (an absent
    list may be either "no string" or the empty text)."""
    strings = events.strings
    type_ids, slot = group_ids(events.input_type[rows])
    texts = [strings[i] for i in type_ids.tolist()]
    typed = np.fromiter((t not in ("", "[]") for t in texts), bool, type_ids.size)[slot]
    double = np.zeros(rows.size, dtype=bool)
    candidates = np.flatnonzero(np.fromiter(("double" in t for t in texts), bool, type_ids.size)[slot])
    if candidates.size:
        chosen = rows[candidates]
        double[candidates] = by_dims_and_types(events, chosen, _double_input) & ~events.name_mask(_is_conversion, chosen)
    return typed, double


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
