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
from typing import Callable

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.markers import name_mask
from torchscope.analysis.nesting import has_ancestor_in
from torchscope.analysis.patterns import by_dims_and_types, input_shapes
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import Embeddings
from torchscope.trace.kinds import Kind
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
    lookups = _in_steps(events, step_of, _is_lookup)
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
    dense = _in_steps(events, step_of, _is_dense_backward)
    out = Embeddings(
        tables=[_label(shape) for shape in tables],
        lookups_per_step={_label(shape): looked / n for shape, looked in tables.items()},
    )
    if dense.size == 0:
        return out  # sparse gradients (or no backward through them): nothing dense to measure
    # Whole-table work outside the forward: ops whose first input has a table's shape (zero_grad's fill, the
    # optimizer's passes over the table and its moments), outermost only, with the dense backward itself.
    forward = span.phase_sets.get("forward", intervals.EMPTY)
    ops = np.flatnonzero(span.times.op_mask & (step_of >= 0))
    ops = ops[~intervals.contains(forward, events.ts_us[ops])] if forward[0].size else ops
    on_table = ops[by_dims_and_types(events, ops, _first_input_in(set(tables)))]
    work = np.concatenate([on_table, dense])
    mask = np.zeros(len(events), dtype=bool)
    mask[work] = True
    work = work[~has_ancestor_in(span.tree, mask, work)]
    cost = span.times.device_total_us[work] if span.has_device else events.dur_us[work]
    out.dense_tables = [_label(shape) for shape in tables]
    out.dense_update_us_per_step = float(cost.sum()) / n
    start = events.ts_us[work]
    in_optimizer = intervals.intersect(intervals.union(start, start + events.dur_us[work]), span.phase_sets.get("optimizer", intervals.EMPTY))
    out.dense_update_in_optimizer_us_per_step = intervals.total_length(in_optimizer) / n
    out.time_base = "device" if span.has_device else "host"
    return out


def _in_steps(events: EventTable, step_of: np.ndarray, predicate: Callable[[str], bool]) -> np.ndarray:
    rows = np.flatnonzero(name_mask(events, predicate, (Kind.CPU_OP,)))
    return rows[step_of[rows] >= 0]


def _label(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def _first_input_in(shapes: set[tuple[int, ...]]) -> Callable[[str, str], bool]:
    def test(dims: str, types: str) -> bool:
        parsed = input_shapes(dims)
        return parsed is not None and bool(parsed) and tuple(parsed[0]) in shapes

    return test
