"""Attention computed op by op: what the score tensor costs when it is materialised.

Attention written out (`att = q @ k.transpose(-2, -1) * scale; att = att.masked_fill(mask, -inf);
att = softmax(att, -1); y = att @ v`, nanoGPT's fallback path, or `nn.MultiheadAttention` called with its
default `need_weights=True`) builds a batch x heads x queries x keys score tensor and passes it through
several memory-bound ops, each a full read and write of it, forward and backward.
`F.scaled_dot_product_attention` does the same maths in one fused kernel (flash or memory-efficient on a
GPU, a flash kernel on the CPU) that never materialises the scores: what it saves is those ops' time (a 4-layer
GPT on the CPU, T=256, 8 heads: 253 ms a step written out, 205 ms with SDPA; the score ops took 23 % of the
recorded step).

Found from the recorded input shapes, with no stack needed: a softmax over the last axis (its recorded
`dim`) of a tensor of three or more dimensions whose shape (leading dimensions flattened) is both the product
of a matmul (`[.., T, D] @ [.., D, S]`) and the left operand of another (`[.., T, S] @ [.., S, D]`) in the
steps, outside any SDPA call. The score ops are every operator with an input of such a shape (the mask comes
first in `torch.where(mask, att, min)`), its matmuls excepted (fused attention does them too) and dropout's
(it draws its mask fused as well, on a GPU; on a CPU, SDPA with `dropout_p > 0` takes its math path, which
materialises the scores again: a 4-layer GPT with attention dropout 0.1 stepped in 348 ms written out and
356 ms with SDPA). On a CPU, dropout's backward multiply (autograd's `MulBackward0`, the trace cannot tell it
from the scale's) is counted: it goes with attention dropout too. A shape that is also the input of a linear
layer or a normalisation is left out: the trace cannot tell scores from activations there (one head, and as
many features as tokens).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import msgspec
import numpy as np

from torchscope.analysis.dropout import is_dropout, is_rng
from torchscope.analysis.markers import named_ops_in_steps, named_rows
from torchscope.analysis.nesting import has_ancestor_in
from torchscope.analysis.patterns import input_shapes
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import Attention
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

Key = tuple[int, int, int]  # (leading dimensions' product, rows, columns)

_SOFTMAX = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax", "aten::special_softmax"})
_MATMULS = frozenset({"aten::matmul", "aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm", "aten::addbmm", "aten::einsum"})
# The autograd nodes of matmuls: their backward matmuls are fused attention's work too.
_MATMUL_NODES = frozenset({"BmmBackward0", "BaddbmmBackward0", "MmBackward0", "AddmmBackward0", "AddbmmBackward0"})
# Ops that take activations, not scores: a score shape also seen here is ambiguous.
_ACTIVATION_OPS = frozenset({"aten::linear", "aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::group_norm"})
_DROPOUT_BACKWARD = frozenset({"aten::native_dropout_backward", "NativeDropoutBackward0"})
_MHA_FRAME = "multi_head_attention_forward"


def _is_softmax(name: str) -> bool:
    return name in _SOFTMAX


def _is_matmul(name: str) -> bool:
    return name in _MATMULS


def _is_activation_op(name: str) -> bool:
    return name in _ACTIVATION_OPS


def _is_sdpa(name: str) -> bool:
    return name.startswith(("aten::scaled_dot_product_attention", "aten::_scaled_dot_product"))


def _is_backward(name: str) -> bool:
    return name.endswith("_backward")


def _not_score_work(name: str) -> bool:
    """Ops on a score-shaped tensor that fused attention keeps: matmuls, dropout's mask and its backward."""
    return name in _MATMULS or name in _MATMUL_NODES or name in _DROPOUT_BACKWARD or is_dropout(name) or is_rng(name)


def _is_mha_frame(name: str) -> bool:
    return _MHA_FRAME in name


def attention(span: SpanInput) -> Attention | None:
    """Softmaxes over attention scores outside scaled_dot_product_attention in the steps, the time of the
    ops on those score tensors, and the fused calls, per step (None: no step, or neither softmax nor SDPA)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    step_of = event_steps(events, steps)
    softmax = named_ops_in_steps(events, step_of, _is_softmax)
    fused = _outermost(span, named_ops_in_steps(events, step_of, _is_sdpa))
    if softmax.size == 0 and fused.size == 0:
        return None
    n = len(steps)
    forward_calls = ~events.name_mask(_is_backward, fused)  # the fused backward is an op of its own
    found = Attention(fused_calls_per_step=float(forward_calls.sum()) / n, time_base="device" if span.has_device else "host")
    sdpa = np.zeros(len(events), dtype=bool)
    sdpa[fused] = True  # the outermost SDPA calls: what they hold is theirs
    softmax = _outermost(span, softmax[~has_ancestor_in(span.tree, sdpa, softmax)])  # SDPA's math path has one
    scores = _score_keys(events, step_of, softmax)
    if not scores:
        return found
    calls = softmax[_first_input_in(events, softmax, scores)]
    dropouts = _outermost(span, named_ops_in_steps(events, step_of, is_dropout))
    dropouts = dropouts[_first_input_in(events, dropouts, scores)]
    drops = _drops(events, dropouts)
    in_mha, with_stacks = _calling_code(span, calls)
    return msgspec.structs.replace(
        found,
        calls_per_step=calls.size / n,
        score_shapes=sorted(_label(key) for key in scores),
        score_us_per_step=float(_score_op_time(span, step_of, scores, sdpa)) / n,
        need_weights_calls_per_step=float(in_mha.sum()) / n,
        calls_with_stacks_per_step=float(with_stacks.sum()) / n,
        dropout_calls_per_step=float((drops == 1).sum()) / n,
        dropout_p_unknown_calls_per_step=float((drops == -1).sum()) / n,
    )


def _score_keys(events: EventTable, step_of: np.ndarray, softmax: np.ndarray) -> set[Key]:
    """The keys of the score tensors: those of softmaxes over their last axis that a matmul produced and
    another takes as its left operand, less any a linear layer or normalisation also takes."""
    softmax = softmax[_over_last_axis(events, softmax)]
    produced, consumed = _matmul_keys(events, named_ops_in_steps(events, step_of, _is_matmul))
    activations = _first_input_keys(events, named_ops_in_steps(events, step_of, _is_activation_op))
    return (_first_input_keys(events, softmax) & produced & consumed) - activations


def _score_op_time(span: SpanInput, step_of: np.ndarray, scores: set[Key], sdpa: np.ndarray) -> float:
    """The own time of the ops in the steps with a score-shaped input (`att * scale`, `torch.where(mask, att,
    min)`, softmax and their backward), but not the work fused attention keeps: matmuls, dropout, and what
    they or an SDPA call hold."""
    events = span.events
    ops = np.flatnonzero(span.times.op_mask & (step_of >= 0))
    ops = ops[_any_input_in(events, ops, scores)]
    ops = ops[~events.name_mask(_not_score_work, ops)]
    kept = np.zeros(len(events), dtype=bool)
    kept[named_rows(events, _not_score_work, (Kind.CPU_OP,))] = True
    kept |= sdpa
    ops = ops[~has_ancestor_in(span.tree, kept, ops)]  # dropout's own multiply, a matmul's copies
    own_us = span.times.device_self_us if span.has_device else span.times.host_self_us
    return float(own_us[ops].sum())


def _calling_code(span: SpanInput, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per call: whether nn.MultiheadAttention's need_weights path made it, and whether a Python frame (a
    recorded stack) encloses it at all: without stacks the caller is unknown."""
    events = span.events
    frames = events.kind_mask(Kind.PYTHON_FUNCTION)
    with_stacks = has_ancestor_in(span.tree, frames, calls)
    mha = np.zeros(len(events), dtype=bool)
    mha[named_rows(events, _is_mha_frame, (Kind.PYTHON_FUNCTION,))] = True
    return has_ancestor_in(span.tree, mha, calls), with_stacks



def _outermost(span: SpanInput, rows: np.ndarray) -> np.ndarray:
    """The rows no other of `rows` encloses (aten::softmax holds aten::_softmax)."""
    mask = np.zeros(len(span.events), dtype=bool)
    mask[rows] = True
    return rows[~has_ancestor_in(span.tree, mask, rows)]


def _by_dims_and_concrete(events: EventTable, rows: np.ndarray, test: Callable[[list[list[int]], list[Any]], int]) -> np.ndarray:
    """Per row: `test(input shapes, concrete inputs)`, run once per distinct pair of recorded texts (an
    absent or unreadable list is [])."""
    key = (events.input_dims[rows].astype(np.int64) << 32) | events.concrete_inputs[rows].astype(np.int64)
    unique, slot = group_ids(key)
    strings = events.strings
    values = [test(input_shapes(strings[k >> 32]) or [], _concrete(strings[k & 0xFFFFFFFF])) for k in unique.tolist()]
    return np.asarray(values, dtype=np.int64)[slot] if rows.size else np.zeros(0, dtype=np.int64)


def _concrete(text: str) -> list[Any]:
    try:
        value = msgspec.json.decode(text) if text else []
    except msgspec.DecodeError:
        return []
    return value if isinstance(value, list) else []


def _over_last_axis(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per softmax row: whether it normalises over the last axis, the keys (slot attention normalises over
    the queries, which no fused attention does). True when the axis was not recorded."""
    return _by_dims_and_concrete(events, rows, _last_axis) == 1


def _last_axis(shapes: list[list[int]], concrete: list[Any]) -> int:
    try:
        dim = int(concrete[1])
    except (IndexError, ValueError, TypeError):
        return 1
    return int(bool(shapes) and dim in (-1, len(shapes[0]) - 1))


def _drops(events: EventTable, rows: np.ndarray) -> np.ndarray:
    """Per dropout row, from its recorded concrete inputs `(input, p, train)`: 1 when it drops (p > 0 in
    training), 0 when not (`F.dropout(att, 0.0)` still records the op; SDPA with dropout_p=0 keeps its fused
    kernel), -1 when they were not recorded."""
    return _by_dims_and_concrete(events, rows, _dropout_state)


def _dropout_state(shapes: list[list[int]], concrete: list[Any]) -> int:
    try:
        return int(float(concrete[1]) > 0 and concrete[2] != "False")
    except (IndexError, ValueError, TypeError):
        return -1


def _key(shape: list[int]) -> Key | None:
    """A tensor of three or more dimensions as (leading dimensions' product, rows, columns)."""
    if len(shape) < 3:
        return None
    return (math.prod(shape[:-2]), shape[-2], shape[-1])


def _shapes_by_row(events: EventTable, rows: np.ndarray) -> tuple[list[list[list[int]]], np.ndarray]:
    """The recorded input shapes of each distinct dims text among `rows`, and each row's slot in them."""
    ids, slot = group_ids(events.input_dims[rows])
    return [input_shapes(text) or [] for text in events.text(ids)], slot


def _first_input_keys(events: EventTable, rows: np.ndarray) -> set[Key]:
    shapes, _ = _shapes_by_row(events, rows)
    return {key for parsed in shapes if parsed and (key := _key(parsed[0])) is not None}


def _first_input_in(events: EventTable, rows: np.ndarray, keys: set[Key]) -> np.ndarray:
    """Per row: whether its first input's key is one of `keys`."""
    shapes, slot = _shapes_by_row(events, rows)
    hit = np.fromiter((bool(parsed) and _key(parsed[0]) in keys for parsed in shapes), bool, len(shapes))
    return hit[slot] if rows.size else np.zeros(0, dtype=bool)


def _any_input_in(events: EventTable, rows: np.ndarray, keys: set[Key]) -> np.ndarray:
    """Per row: whether one of its tensor inputs has one of `keys` (`torch.where(mask, att, min)` has the
    mask first)."""
    shapes, slot = _shapes_by_row(events, rows)
    hit = np.fromiter((any(_key(shape) in keys for shape in parsed) for parsed in shapes), bool, len(shapes))
    return hit[slot] if rows.size else np.zeros(0, dtype=bool)


def _matmul_keys(events: EventTable, rows: np.ndarray) -> tuple[set[Key], set[Key]]:
    """The keys matmuls produce (`[.., T, D] @ [.., D, S]` -> (lead, T, S)), and those of their left operands
    when the right one is `[.., S, D]`: what a score tensor is made by and multiplied into."""
    produced: set[Key] = set()
    consumed: set[Key] = set()
    shapes, _ = _shapes_by_row(events, rows)
    for parsed in shapes:
        tensors = [s for s in parsed if len(s) >= 3]
        if len(tensors) == 3:  # baddbmm: the added scores first
            tensors = tensors[1:]
        if len(tensors) != 2:
            continue
        left, right = tensors
        if left[-1] != right[-2]:
            continue
        lead = max(math.prod(left[:-2]), math.prod(right[:-2]))  # broadcast leading dimensions
        produced.add((lead, left[-2], right[-1]))
        consumed.add((lead, left[-2], left[-1]))
    return produced, consumed


def _label(key: Key) -> str:
    return "x".join(str(d) for d in key)
