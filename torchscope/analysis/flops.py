"""FLOPs of matrix-multiply and convolution operators from their recorded input shapes (`record_shapes=True`).

Multiply-adds count 2 FLOPs, as in torch.utils.flop_counter and the profiler's `with_flops`:
* `aten::mm` [n, k] x [k, m] and `aten::addmm` (bias, [n, k], [k, m]): 2 n k m;
* `aten::bmm` [b, n, k] x [b, k, m] and `aten::baddbmm` (bias, ...): 2 b n k m;
* `aten::linear` (input [..., k], weight [m, k], bias): 2 x (input elements) x m;
* `aten::matmul` of 2-D operands: as mm.
* convolutions (`aten::conv1d/2d/3d`, `aten::convolution`, `aten::_convolution`, `aten::conv_transpose*`):
  2 x batch x (weight elements) x (output positions), or x (input positions) when transposed, as
  torch.utils.flop_counter's conv_flop_count. The output size needs stride, padding and dilation: PyTorch
  2.x records them with the shapes, as text, in "Concrete Inputs"; older traces lack it and get no figure.
The profiler's own `flops` argument (`with_flops=True`) is not in exported Chrome traces (PyTorch 2.13
writes none), so it is not read. Ops are looked up once per distinct (name, shapes, scalars) triple, then
mapped to events.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import msgspec
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

# Convolutions: op name -> positions of (stride, padding, dilation, transposed) among the arguments
# (None: a fixed value), from the ATen schemas (native_functions.yaml).
MATMUL_OPS = frozenset(_FORMULAS)  # the matrix-multiply family (the rest with FLOPs: convolutions)

_CONV_ARGS: dict[str, tuple[int, int, int, Optional[int]]] = {
    "aten::conv1d": (3, 4, 5, None),
    "aten::conv2d": (3, 4, 5, None),
    "aten::conv3d": (3, 4, 5, None),
    "aten::convolution": (3, 4, 5, 6),
    "aten::_convolution": (3, 4, 5, 6),
    # conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups, dilation)
    "aten::conv_transpose1d": (3, 4, 7, None),
    "aten::conv_transpose2d": (3, 4, 7, None),
    "aten::conv_transpose3d": (3, 4, 7, None),
}


def _ints(text: str, dims: int) -> Optional[list[int]]:
    """A scalar-list argument ("[2, 2]", or one int for every dimension) as `dims` ints."""
    try:
        value = msgspec.json.decode(text)
    except (msgspec.DecodeError, ValueError):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * dims
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value * dims if len(value) == 1 else value if len(value) == dims else None
    return None


def _conv(name: str, shapes: list[object], scalars: list[object]) -> Optional[float]:
    stride_at, padding_at, dilation_at, transposed_at = _CONV_ARGS[name]
    x, w = shapes[0], shapes[1]
    if not (isinstance(x, list) and isinstance(w, list) and len(x) == len(w) >= 3):
        return None
    if not all(isinstance(d, int) for d in (*x, *w)) or len(scalars) <= max(stride_at, padding_at, dilation_at):
        return None
    spatial = len(x) - 2
    transposed = name.startswith("aten::conv_transpose") or (
        transposed_at is not None and len(scalars) > transposed_at and scalars[transposed_at] == "True")
    if transposed:  # work per input position; the output size is not needed
        positions = math.prod(x[2:])
    else:
        stride = _ints(str(scalars[stride_at]), spatial)
        dilation = _ints(str(scalars[dilation_at]), spatial)
        padding_text = str(scalars[padding_at]).strip("'\"")
        if padding_text == "valid":
            padding: Optional[list[int]] = [0] * spatial
        elif padding_text == "same":  # output size = input size (PyTorch allows "same" only with stride 1)
            padding, stride = None, [1] * spatial
        else:
            padding = _ints(padding_text, spatial)
        if stride is None or dilation is None or (padding is None and padding_text != "same"):
            return None
        out = x[2:] if padding is None else [
            (size + 2 * p - d * (k - 1) - 1) // s + 1 for size, p, d, k, s in zip(x[2:], padding, dilation, w[2:], stride)]
        if any(o <= 0 for o in out):
            return None
        positions = math.prod(out)
    return 2.0 * x[0] * math.prod(w) * positions


def op_flops(name: str, input_dims: str, concrete_inputs: str = "") -> Optional[float]:
    """FLOPs of one call of `name` with the recorded `Input Dims` (and `Concrete Inputs`) text; None when
    not derivable."""
    if not input_dims or (name not in _FORMULAS and name not in _CONV_ARGS):
        return None
    try:
        shapes = msgspec.json.decode(input_dims)
        scalars = msgspec.json.decode(concrete_inputs) if concrete_inputs else []
    except (msgspec.DecodeError, ValueError):
        return None
    if not isinstance(shapes, list):
        return None
    if name in _CONV_ARGS:
        return _conv(name, shapes, scalars) if isinstance(scalars, list) and len(shapes) >= 2 else None
    first, compute = _FORMULAS[name]
    operands = shapes[first:]
    if len(operands) < 2 or not all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in operands[:2]):
        return None
    return compute(operands)


def event_flops(events: EventTable, ops: np.ndarray) -> np.ndarray:
    """FLOPs of each op event in `ops` (NaN where not derivable). Only ops named in the formulas are
    looked at, each distinct (name, shapes, scalars) once."""
    flops = np.full(ops.size, np.nan)
    named = np.flatnonzero(events.name_mask(lambda name: name in _FORMULAS or name in _CONV_ARGS, ops))
    if named.size == 0:
        return flops
    rows = ops[named]
    pair = (events.name[rows].astype(np.int64) << 32) | events.input_dims[rows].astype(np.int64)
    scalars = events.concrete_inputs[rows]
    order = np.lexsort((scalars, pair))
    new_key = np.ones(order.size, dtype=bool)
    new_key[1:] = (pair[order][1:] != pair[order][:-1]) | (scalars[order][1:] != scalars[order][:-1])
    firsts = rows[order[new_key]]
    text = events.strings
    per_key = np.array(
        [op_flops(text[n], text[d], text[c]) for n, d, c in zip(
            events.name[firsts].tolist(), events.input_dims[firsts].tolist(), events.concrete_inputs[firsts].tolist())],
        dtype=float,
    )  # None -> NaN
    key_of = np.empty(order.size, dtype=np.int64)
    key_of[order] = np.cumsum(new_key) - 1
    flops[named] = per_key[key_of]
    return flops
