"""FLOPs of matrix-multiply operators from their recorded input shapes (`record_shapes=True`).

Multiply-adds count 2 FLOPs, as in torch.utils.flop_counter and the profiler's `with_flops`:
* `aten::mm` [n, k] x [k, m] and `aten::addmm` (bias, [n, k], [k, m]): 2 n k m;
* `aten::bmm` [b, n, k] x [b, k, m] and `aten::baddbmm` (bias, ...): 2 b n k m;
* `aten::linear` (input [..., k], weight [m, k], bias): 2 x (input elements) x m;
* `aten::matmul` of 2-D operands: as mm.
Convolutions are not counted: their FLOPs need the output size, and the trace records neither stride nor
padding unless "Concrete Inputs" are read, which the trace schema does not declare yet. Ops are looked up
once per distinct (name, shapes) pair, then mapped to events.
"""

from __future__ import annotations

import json
import math
from typing import Callable, Optional

import numpy as np

from torchscope.trace.tables import EventTable

Shapes = list[list[int]]


def _mm(shapes: Shapes) -> Optional[float]:
    a, b = shapes[0], shapes[1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2.0 * a[0] * a[1] * b[1]
    return None


def _bmm(shapes: Shapes) -> Optional[float]:
    a, b = shapes[0], shapes[1]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return None


def _linear(shapes: Shapes) -> Optional[float]:
    x, w = shapes[0], shapes[1]
    if len(x) >= 1 and len(w) == 2 and x[-1] == w[1]:
        return 2.0 * math.prod(x) * w[0]
    return None


_FORMULAS: dict[str, tuple[int, Callable[[Shapes], Optional[float]]]] = {
    # op name -> (index of the first matrix operand, formula)
    "aten::mm": (0, _mm),
    "aten::matmul": (0, _mm),
    "aten::addmm": (1, _mm),
    "aten::bmm": (0, _bmm),
    "aten::baddbmm": (1, _bmm),
    "aten::linear": (0, _linear),
}


def op_flops(name: str, input_dims: str) -> Optional[float]:
    """FLOPs of one call of `name` with the recorded `Input Dims` text; None when not derivable."""
    formula = _FORMULAS.get(name)
    if formula is None or not input_dims:
        return None
    try:
        shapes = json.loads(input_dims)
    except ValueError:
        return None
    first, compute = formula
    operands = shapes[first:] if isinstance(shapes, list) else []
    if len(operands) < 2 or not all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in operands[:2]):
        return None
    return compute(operands)


def event_flops(events: EventTable, ops: np.ndarray) -> np.ndarray:
    """FLOPs of each op event in `ops` (NaN where not derivable)."""
    if ops.size == 0:
        return np.zeros(0)
    pairs = (events.name[ops].astype(np.int64) << 32) | events.input_dims[ops].astype(np.int64)
    unique, inverse = np.unique(pairs, return_inverse=True)
    per_pair = np.array(
        [op_flops(events.strings[int(p >> 32)], events.strings[int(p & 0xFFFFFFFF)]) for p in unique.tolist()],
        dtype=float,
    )  # None becomes NaN
    return per_pair[inverse]
