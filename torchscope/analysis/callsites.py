"""Where the top operators are called from: the innermost frame of the user's own code above each op.

With ``with_stack`` (torchscope's default) the Python tracer records every Python call as a
``python_function`` event named ``path/to/file.py(42): func`` (42: the function's first line, not the
calling line: that is what the tracer records; a frame already running when profiling started is named
by its running line, moved to its function's first line where the source is at hand, so one function is
one site: analysis/source_lines.py); an op's call site is its nearest enclosing
frame outside libraries (site-packages, torch, the standard library) and outside the profiler and
torchscope. Per (operator, call site): calls, host self and device self time, so the sites of one
operator add up to (at most) its row in the operator table. The operators chosen are the largest by host
+ device self time, the operator table's order. Vectorised: one label per distinct string, then one
ancestor lookup per event (analysis/nesting.py).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from torchscope.analysis.frames import is_user_frame, readable
from torchscope.analysis.nesting import nearest_ancestor_of
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.source_lines import function_start, source_roots
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids
from torchscope.report.model import CallSiteRow
from torchscope.trace.kinds import Kind

TOP_OPERATORS = 10
SITES_PER_OPERATOR = 3


class CallSiteTable(msgspec.Struct, kw_only=True):
    rows: list[CallSiteRow]


def call_site_rows(span: SpanInput, top: int = TOP_OPERATORS * 2) -> list[CallSiteRow]:
    """(operator, site) rows of one span for its `top` operators (more than reported: merged later)."""
    events, times = span.events, span.times
    ops = np.flatnonzero(times.op_mask)
    frames = events.kind_mask(Kind.PYTHON_FUNCTION) & events.name_mask(is_user_frame)
    if ops.size == 0 or not frames.any():
        return []
    self_us = times.host_self_us[ops] + times.device_self_us[ops]
    names, by_name = group_ids(events.name[ops])
    chosen = np.zeros(names.size, dtype=bool)  # per name code (a lookup, not np.isin over every op)
    chosen[np.argsort(-np.bincount(by_name, self_us, names.size), kind="stable")[:top]] = True
    ops = ops[chosen[by_name]]
    site = nearest_ancestor_of(span.tree, frames)[ops]
    ops, site = ops[site >= 0], site[site >= 0]
    key = (events.name[ops].astype(np.int64) << 32) | events.name[site].astype(np.int64)
    unique, group = np.unique(key, return_inverse=True)
    roots = source_roots(span.file)
    calls = np.bincount(group, minlength=unique.size)
    host = np.bincount(group, times.host_self_us[ops], unique.size)
    device = np.bincount(group, times.device_self_us[ops], unique.size)
    return [
        CallSiteRow(operator=events.strings[k >> 32], site=readable(function_start(events.strings[k & 0xFFFFFFFF], roots)),
                    calls=int(calls[g]), host_self_us=float(host[g]), device_self_us=float(device[g]))
        for g, k in enumerate(unique.tolist())
    ]


def extract_call_sites(span: SpanInput) -> CallSiteTable:
    return CallSiteTable(rows=call_site_rows(span))


def reduce_call_sites(parts: list[Part[CallSiteTable]]) -> dict[str, Any]:
    """Rows merged over spans and ranks; the top operators' top sites, largest operator first."""
    merged: dict[tuple[str, str], CallSiteRow] = {}
    for part in parts:
        for row in part.value.rows:
            seen = merged.setdefault((row.operator, row.site), msgspec.structs.replace(row, calls=0, host_self_us=0.0, device_self_us=0.0))
            seen.calls += row.calls
            seen.host_self_us += row.host_self_us
            seen.device_self_us += row.device_self_us
    per_operator: dict[str, list[CallSiteRow]] = {}
    for row in merged.values():
        per_operator.setdefault(row.operator, []).append(row)

    def cost(row: CallSiteRow) -> float:
        return row.host_self_us + row.device_self_us

    ranked = sorted(per_operator.values(), key=lambda rows: -sum(map(cost, rows)))[:TOP_OPERATORS]
    return {"call_sites": [r for rows in ranked for r in sorted(rows, key=lambda r: (-cost(r), r.site))[:SITES_PER_OPERATOR]]}


CALL_SITES = Analysis(
    name="call_sites", extract=extract_call_sites, extract_type=CallSiteTable, reduce=reduce_call_sites, fills=("call_sites",),
)
