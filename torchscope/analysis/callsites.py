"""Where the top operators are called from: the innermost frame of the user's own code above each op, and
the user's call stack above it.

With ``with_stack`` (torchscope's default) the Python tracer records every Python call as a
``python_function`` event named ``path/to/file.py(42): func`` (42: the function's first line, not the
calling line: that is what the tracer records; a frame already running when profiling started is named
by its running line, moved to its function's first line where the source is at hand, so one function is
one site: analysis/source_lines.py); an op's call site is its nearest enclosing
frame outside libraries (site-packages, torch, the standard library) and outside the profiler and
torchscope. Per (operator, call site): calls, host self and device self time, so the sites of one
operator add up to (at most) its row in the operator table. The operators chosen are the largest by host
+ device self time, the operator table's order.

Call stacks. Each row also carries ``stack``: the chain of the user's own frames above the op, outermost
first, ending with ``site`` (library, torch and profiler frames between them left out, as for the site),
at most ``STACK_DEPTH`` frames (the innermost ones: deeper chains lose their outermost frames). Rows stay
keyed by (operator, innermost site), not by (operator, full stack) as the TensorBoard plugin's "operator +
call stack" grouping was: the site is what `torchscope diff` matches operators on (pipeline/diff.py), and a
function reached from many callers stays one row instead of splitting its time over rows that each fall
under the report's cut. Where one site is reached along several stacks (two callers of the same function),
the row shows the costliest stack (most host + device self time, over every span and rank) and
``stack_share``, that stack's part of the row's self time, so a stack covering 60 % of the row says so.
Each span's extract keeps one row per (operator, full stack), so the reduce sums the same stack over spans
and ranks before it picks the costliest.

Vectorised: one label per distinct string, one ancestor lookup per event (analysis/nesting.py); the
stacks are built over the user frames only (far fewer than ops), one level per step, at most
``STACK_DEPTH`` steps, then one sort of the frames by their chains gives each chain an id; the ops are then
grouped once by (operator, their frame's stack id), as they were by (operator, site) before. No
per-event Python loop.
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
STACK_DEPTH = 8  # user frames kept per stack, innermost first cut-off: enough for train loop -> step -> model code


class CallSiteTable(msgspec.Struct, kw_only=True):
    rows: list[CallSiteRow]  # one per (operator, full stack) in a span's extract


def _user_stacks(span: SpanInput, rows: np.ndarray, user: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per user frame event (`rows`, the frames' event indices): a stack id (equal ids: the same names along the
    same chain) and the chain's name codes + 1, innermost first (level 0: the frame; 0 past the top), at
    most STACK_DEPTH levels. Works on the few user frames, not on every op."""
    events, parent = span.events, span.tree.parent
    current = rows
    codes: list[np.ndarray] = []
    for _ in range(STACK_DEPTH):
        code = np.where(current >= 0, events.name[np.maximum(current, 0)].astype(np.int64) + 1, 0)
        if codes and not code.any():
            break
        codes.append(code)
        up = parent[np.maximum(current, 0)]
        current = np.where((current >= 0) & (up >= 0), user[np.maximum(up, 0)], -1)
    # One sort over every level (cheaper than a unique per level): equal chains are neighbours.
    matrix = np.stack(codes)
    order = np.lexsort(matrix)
    ordered = matrix[:, order]
    starts = np.ones(order.size, dtype=bool)
    starts[1:] = (ordered[:, 1:] != ordered[:, :-1]).any(axis=0)
    stack_id = np.empty(order.size, dtype=np.int64)
    stack_id[order] = np.cumsum(starts) - 1
    return stack_id, codes


def call_site_rows(span: SpanInput, top: int = TOP_OPERATORS * 2) -> list[CallSiteRow]:
    """(operator, full stack) rows of one span for its `top` operators (more than reported: merged later)."""
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
    user = nearest_ancestor_of(span.tree, frames)
    site = user[ops]
    ops, site = ops[site >= 0], site[site >= 0]
    if ops.size == 0:
        return []
    frame_rows = np.flatnonzero(frames)
    stack_id, codes = _user_stacks(span, frame_rows, user)
    at_site = np.searchsorted(frame_rows, site)  # each op's frame, as a row of frame_rows
    key = (events.name[ops].astype(np.int64) << 32) | stack_id[at_site]
    unique, group = np.unique(key, return_inverse=True)
    group = group.reshape(-1)
    first = np.full(unique.size, ops.size, dtype=np.int64)
    np.minimum.at(first, group, np.arange(ops.size))
    calls = np.bincount(group, minlength=unique.size)
    host = np.bincount(group, times.host_self_us[ops], unique.size)
    device = np.bincount(group, times.device_self_us[ops], unique.size)
    roots = source_roots(span.file)
    label: dict[int, str] = {}

    def name(code: int) -> str:  # one readable label per distinct frame string
        if code not in label:
            label[code] = readable(function_start(events.strings[code - 1], roots))
        return label[code]

    rows = []
    for g, at in enumerate(first.tolist()):
        frame = int(at_site[at])
        stack = [name(int(c[frame])) for c in reversed(codes) if c[frame] > 0]
        rows.append(CallSiteRow(operator=events.strings[int(events.name[ops[at]])], site=stack[-1], calls=int(calls[g]),
                                host_self_us=float(host[g]), device_self_us=float(device[g]), stack=stack))
    return rows


def extract_call_sites(span: SpanInput) -> CallSiteTable:
    return CallSiteTable(rows=call_site_rows(span))


def _cost(row: CallSiteRow) -> float:
    return row.host_self_us + row.device_self_us


def _sum_into(merged: dict[Any, CallSiteRow], key: Any, row: CallSiteRow) -> CallSiteRow:
    seen = merged.setdefault(key, msgspec.structs.replace(row, calls=0, host_self_us=0.0, device_self_us=0.0))
    seen.calls += row.calls
    seen.host_self_us += row.host_self_us
    seen.device_self_us += row.device_self_us
    return seen


def merge_call_sites(rows: list[CallSiteRow]) -> list[CallSiteRow]:
    """(operator, full stack) rows summed per (operator, site), each with its costliest stack and that
    stack's share of the row's self time (by calls where no time was measured)."""
    paths: dict[tuple[str, str, tuple[str, ...]], CallSiteRow] = {}
    for row in rows:
        _sum_into(paths, (row.operator, row.site, tuple(row.stack)), row)
    sites: dict[tuple[str, str], CallSiteRow] = {}
    best: dict[tuple[str, str], CallSiteRow] = {}
    for path in sorted(paths.values(), key=lambda r: (-_cost(r), -r.calls, r.stack)):  # costliest first
        sites_key = (path.operator, path.site)
        _sum_into(sites, sites_key, path)
        best.setdefault(sites_key, path)
    out = []
    for sites_key, row in sites.items():
        path = best[sites_key]
        total, part = (_cost(row), _cost(path)) if _cost(row) > 0 else (float(row.calls), float(path.calls))
        share = part / total if total > 0 and path.stack else 0.0
        out.append(msgspec.structs.replace(row, stack=list(path.stack), stack_share=round(share, 4)))
    return out


def reduce_call_sites(parts: list[Part[CallSiteTable]]) -> dict[str, Any]:
    """Rows merged over spans and ranks; the top operators' top sites, largest operator first."""
    merged = merge_call_sites([row for part in parts for row in part.value.rows])
    per_operator: dict[str, list[CallSiteRow]] = {}
    for row in merged:
        per_operator.setdefault(row.operator, []).append(row)
    ranked = sorted(per_operator.values(), key=lambda rows: -sum(map(_cost, rows)))[:TOP_OPERATORS]
    return {"call_sites": [r for rows in ranked for r in sorted(rows, key=lambda r: (-_cost(r), r.site))[:SITES_PER_OPERATOR]]}


CALL_SITES = Analysis(
    name="call_sites", extract=extract_call_sites, extract_type=CallSiteTable, reduce=reduce_call_sites, fills=("call_sites",),
)
