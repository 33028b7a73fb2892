"""Large embedding tables trained with dense gradients: every step pays for the whole table.

`nn.Embedding` (sparse=False, the default) backpropagates a gradient as large as its table
(`aten::embedding_dense_backward` fills a table-sized tensor), `zero_grad` clears it, and the optimizer
updates every row (Adam: several passes over the table and its two moments), though a step looks up only
its batch's indices. With a table of a million rows and a batch of a few thousand lookups, nearly all of
that work is on rows the step never touched (a 1,000,000x64 table, 512x4 lookups a step, Adam on the CPU:
360 ms a step dense, 3.9 ms with `sparse=True` and `torch.optim.SparseAdam`).

Measured from the recorded input shapes: the lookups (`aten::embedding`, `aten::embedding_bag`) name each
table's shape and the indices they read; the work on a whole table outside the forward is every op whose
first input has a dense table's shape, plus the dense backward itself.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import named_ops_in_steps
from torchscope.analysis.nesting import has_ancestor_in
from torchscope.analysis.patterns import input_shapes
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import Embeddings
from torchscope.trace.tables import EventTable

MIN_TABLE_VALUES = 1 << 20  # a table of a million values or more: what a dense update costs on
_LOOKUPS = frozenset({"aten::embedding", "aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"})
_DENSE_BACKWARD = frozenset({"aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward"})


def _is_lookup(name: str) -> bool:
    return name in _LOOKUPS


def _is_dense_backward(name: str) -> bool:
    return name in _DENSE_BACKWARD


def embeddings(span: SpanInput) -> Embeddings | None:
    """The large tables looked up in the steps, their lookups per step, which get dense gradients, and the
    time spent on whole dense tables outside the forward, per step (None: no large table looked up)."""
    events, steps = span.events, span.steps
    if len(steps) == 0:
        return None
    step_of = event_steps(events, steps)
    lookups = named_ops_in_steps(events, step_of, _is_lookup)
    is_lookup = np.zeros(len(events), dtype=bool)
    is_lookup[lookups] = True
    lookups = lookups[~has_ancestor_in(span.tree, is_lookup, lookups)]  # embedding_bag holds _embedding_bag
    tables: dict[tuple[int, ...], float] = {}
    names, slot = group_ids(events.input_dims[lookups])
    for dims_id, count in zip(names.tolist(), np.bincount(slot, minlength=names.size).tolist()):
        parsed = input_shapes(events.strings[dims_id]) or []
        if len(parsed) >= 2 and len(parsed[0]) == 2 and math.prod(parsed[0]) >= MIN_TABLE_VALUES:
            shape = tuple(parsed[0])
            tables[shape] = tables.get(shape, 0.0) + count * math.prod(parsed[1])
    if not tables:
        return None
    n = len(steps)
    out = Embeddings(
        tables=[_label(shape) for shape in tables],
        lookups_per_step={_label(shape): looked / n for shape, looked in tables.items()},
    )
    # Dense: a dense backward of the table's row count ran (each table apart: a sparse one beside a small dense
    # one is no dense table). Not one whose shape is a matmul's operand in the steps: a language model's
    # embedding tied to its output layer gets a dense gradient from the logits whatever `sparse` says, and an
    # untied output layer of the same shape cannot be told apart from it.
    dense = named_ops_in_steps(events, step_of, _is_dense_backward)
    rows = _dense_rows(events, dense)
    dense_shapes = {shape for shape in tables if shape[0] in rows} - _matmul_operands(events, step_of)
    if not dense_shapes:
        return out
    # Whole-table work outside the forward: ops whose first input is a dense table (zero_grad's fill, the
    # optimizer's passes over the table and its moments), or a list holding it (foreach and fused optimizers:
    # the table's part of the list's elements), outermost only, with the dense backward itself.
    forward = span.phase_sets.get("forward", intervals.EMPTY)
    ops = np.flatnonzero(span.times.op_mask & (step_of >= 0))
    ops = ops[~intervals.contains(forward, events.ts_us[ops])] if forward[0].size else ops
    part = _table_part(events, ops, dense_shapes)
    work = np.concatenate([ops[part > 0], dense])
    weight = np.concatenate([part[part > 0], np.ones(dense.size)])
    mask = np.zeros(len(events), dtype=bool)
    mask[work] = True
    outermost = ~has_ancestor_in(span.tree, mask, work)
    work, weight = work[outermost], weight[outermost]
    cost = span.times.device_total_us[work] if span.has_device else events.dur_us[work]
    out.dense_tables = [_label(shape) for shape in tables if shape in dense_shapes]
    out.dense_update_us_per_step = float((cost * weight).sum()) / n
    out.time_base = "device" if span.has_device else "host"
    return out


# The dense backwards' `num_weights` argument (its place in the recorded concrete inputs): the table's rows.
_NUM_WEIGHTS_AT = {"aten::embedding_dense_backward": 2, "aten::_embedding_bag_dense_backward": 5}
_MATMULS = frozenset({"aten::linear", "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm"})


def _dense_rows(events: EventTable, dense: np.ndarray) -> set[int]:
    rows: set[int] = set()
    for name, concrete in set(zip(events.text(events.name[dense]), events.text(events.concrete_inputs[dense]))):
        try:
            value = msgspec.json.decode(concrete) if concrete else []
            rows.add(int(value[_NUM_WEIGHTS_AT[name]]))
        except (msgspec.DecodeError, ValueError, TypeError, IndexError, KeyError):
            continue
    return rows


def _is_matmul(name: str) -> bool:
    return name in _MATMULS


def _matmul_operands(events: EventTable, step_of: np.ndarray) -> set[tuple[int, ...]]:
    """The 2-d shapes (and their transposes) of the matmuls' operands in the steps."""
    found: set[tuple[int, ...]] = set()
    for dims in set(events.text(events.input_dims[named_ops_in_steps(events, step_of, _is_matmul)])):
        for shape in input_shapes(dims) or []:
            if len(shape) == 2:
                found.update({(shape[0], shape[1]), (shape[1], shape[0])})
    return found


def _table_part(events: EventTable, rows: np.ndarray, shapes: set[tuple[int, ...]]) -> np.ndarray:
    """Per row: the part of its first input that is a table of `shapes`, by elements: 1 for the table itself,
    the table's share of a tensor list's elements (foreach, fused optimizers), else 0."""
    names, slot = group_ids(events.input_dims[rows])
    part = np.zeros(names.size)
    for i, dims in enumerate(events.text(names)):
        try:
            first = msgspec.json.decode(dims)[0] if dims else []
        except (msgspec.DecodeError, IndexError, TypeError, KeyError):
            continue
        if isinstance(first, list) and first and all(isinstance(d, list) for d in first):  # a tensor list
            sizes = [(tuple(d), math.prod(d)) for d in first if all(isinstance(x, int) for x in d)]
            total = sum(size for _, size in sizes)
            part[i] = sum(size for shape, size in sizes if shape in shapes) / total if total else 0.0
        elif isinstance(first, list) and tuple(first) in shapes:
            part[i] = 1.0
    return part[slot]



def _label(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)
