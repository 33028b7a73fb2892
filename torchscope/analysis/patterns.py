"""Anti-patterns of PyTorch's own pattern matcher (`torch.profiler._pattern_matcher`) not covered by
another measurement: a convolution's bias right before a batch norm (the norm cancels it), and FP16/BF16
matmuls whose dimensions are not multiples of 8 (tensor cores need them aligned).

The others map to existing findings: num_workers=0 (`data_loading.exposed`), the single-tensor
optimizer (`optimizer.step` with a for-loop), gradients not set to None (`optimizer.zero_grad_fill`),
FP32 matmuls with TF32 off (`compute.tensor_cores_unused`, GPU). Extra CUDA copies and for-loop indexing
have no rule yet.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np

from torchscope.analysis.host import main_thread_mask
from torchscope.analysis.span import SpanInput
from torchscope.report.measurements import Patterns
from torchscope.trace.tables import EventTable

CONV_OPS = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution"})
HALF_TYPES = ("c10::Half", "c10::BFloat16", "Half", "BFloat16")
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})


def _has_bias(dims: str) -> bool:
    try:
        shapes = json.loads(dims)
    except ValueError:
        return False
    return isinstance(shapes, list) and len(shapes) > 2 and isinstance(shapes[2], list) and len(shapes[2]) > 0


def _misaligned(dims: str) -> bool:
    try:
        shapes = json.loads(dims)
    except ValueError:
        return False
    matrices = [s for s in shapes if isinstance(s, list) and len(s) >= 2] if isinstance(shapes, list) else []
    return any(d % 8 for s in matrices for d in s[-2:] if isinstance(d, int))


def _by_triple(events: EventTable, rows: np.ndarray, names: frozenset[str], test: Callable[[str, str], bool]) -> np.ndarray:
    """Per row: its name is in `names` and `test(dims, types)` holds. The test runs once per distinct
    (name, dims, types) of the rows so named, usually a handful among thousands of ops."""
    result = np.zeros(rows.size, dtype=bool)
    named = np.flatnonzero(events.name_mask(lambda name: name in names, rows))
    if named.size == 0:
        return result
    candidates = rows[named]
    key = np.stack([events.name[candidates], events.input_dims[candidates], events.input_type[candidates]], axis=1)
    unique, inverse = np.unique(key, axis=0, return_inverse=True)
    values = np.array([test(*events.text(u[1:])) for u in unique], dtype=bool)
    result[named] = values[inverse.ravel()]
    return result


def patterns(span: SpanInput) -> Patterns:
    """The per-step counts of the matcher patterns measured here."""
    events, steps = span.events, span.steps
    n = max(len(steps), 1)
    in_steps = steps.index_of(events.ts_us) >= 0
    ops = np.flatnonzero(span.times.op_mask & main_thread_mask(events) & in_steps)
    outermost = ops[span.times.launching_op[np.maximum(span.tree.parent[ops], 0)] < 0] if ops.size else ops
    outermost = outermost[np.argsort(events.ts_us[outermost], kind="stable")]
    if outermost.size < 1:
        return Patterns()
    conv = _by_triple(events, outermost, CONV_OPS, lambda dims, _: _has_bias(dims))
    # The next op, or the one after a BatchNorm's `num_batches_tracked += 1` (training mode).
    is_bn = np.append(events.name_mask(lambda name: name == "aten::batch_norm", outermost), [False, False])
    is_add = np.append(events.name_mask(lambda name: name == "aten::add_", outermost)[1:], False)
    followed_by_bn = is_bn[1:-1] | (is_add & is_bn[2:])
    half = _by_triple(events, outermost, MATMUL_OPS, lambda dims, types: any(t in types for t in HALF_TYPES) and _misaligned(dims))
    return Patterns(
        conv_bias_before_batch_norm_per_step=float((conv & followed_by_bn).sum() / n),
        half_matmuls_misaligned_per_step=float(half.sum() / n),
    )
