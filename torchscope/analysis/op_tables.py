"""The operator tables (by name and by input shapes) and the `record_function` range table, per span
and summed over the run."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from torchscope.analysis.flops import event_flops
from torchscope.analysis.operators import merge_operator_rows, merge_range_rows, operator_rows, range_rows
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.report.model import OperatorRow, RangeRow


class OperatorTables(msgspec.Struct, kw_only=True):
    """One span's operator table, by name and by (name, input shapes)."""

    by_name: list[OperatorRow]
    by_shape: list[OperatorRow]


def extract_operators(span: SpanInput) -> OperatorTables:
    flops = event_flops(span.events, np.flatnonzero(span.times.op_mask))  # once for both tables
    return OperatorTables(
        by_name=merge_operator_rows([operator_rows(span.events, span.times, flops=flops)]),
        by_shape=merge_operator_rows([operator_rows(span.events, span.times, by_shape=True, flops=flops)]),
    )


def reduce_operators(parts: list[Part[OperatorTables]]) -> dict[str, Any]:
    return {
        "operators": merge_operator_rows([p.value.by_name for p in parts]),
        "operators_by_shape": merge_operator_rows([p.value.by_shape for p in parts]),
    }


class RangeTable(msgspec.Struct, kw_only=True):
    rows: list[RangeRow]


def extract_ranges(span: SpanInput) -> RangeTable:
    return RangeTable(rows=range_rows(span.events))


def reduce_ranges(parts: list[Part[RangeTable]]) -> dict[str, Any]:
    return {"ranges": merge_range_rows([p.value.rows for p in parts])}


OPERATORS = Analysis(
    name="operators", extract=extract_operators, extract_type=OperatorTables, reduce=reduce_operators,
    fills=("operators", "operators_by_shape"),
)
RANGES = Analysis(name="ranges", extract=extract_ranges, extract_type=RangeTable, reduce=reduce_ranges, fills=("ranges",))
