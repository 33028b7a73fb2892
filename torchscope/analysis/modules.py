"""Time per ``nn.Module``: the per-module view (what the TensorBoard plugin's "Module View" showed).

Source: the Python tracer's module events, recorded with ``with_stack`` (on by default under torchscope):
every call of a module is a ``python_function`` event named ``nn.Module: <Class>_<n>``, where ``n`` numbers
the instances of one class in the order the profiler first saw them. Nesting gives each call its parent
module, so each call has a *path* (``Sequential_0/Linear_1``; the profiler does not record attribute
names). Per path, over the calls that end inside a step: calls, host time (inclusive), host self time
(less its child modules) and, on device traces, the device time of the kernels launched inside it
(inclusive). Forward only: backward runs in the autograd engine, outside any module call.

Everything is vectorised over events; Python loops run over module depth levels and distinct paths.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from torchscope.analysis.frames import MODULE_CALL_PREFIX, is_measurement_frame, is_module_call
from torchscope.analysis.nesting import HostTree, launcher_of_device_events
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import StepWindows
from torchscope.arrays import group_ids
from torchscope.report.model import ModuleRow
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable

MODULE_PREFIX = MODULE_CALL_PREFIX


class ModuleTotals(msgspec.Struct, kw_only=True):
    """One module path's totals over the steps of one span."""

    path: str
    module: str
    depth: int
    calls: int
    host_us: float
    host_self_us: float
    device_us: float


class ModuleTable(msgspec.Struct, kw_only=True):
    rows: list[ModuleTotals]


def module_rows(events: EventTable, tree: HostTree, steps: StepWindows) -> list[ModuleTotals]:
    """Totals per module path over the module calls that end inside a step (largest host time first)."""
    # Whole-table masks: both are kept per table, and memory's owner walk asks for the same.
    mod = np.flatnonzero(events.kind_mask(Kind.PYTHON_FUNCTION) & events.name_mask(is_module_call))
    if mod.size == 0:
        return []
    # Each event's innermost module call (or itself) as its position in `mod` (-1: none): inherited down
    # the tree from the calls' own positions, so no event-index-to-position table is needed afterwards.
    position = np.full(len(events), -1, dtype=tree.parent.dtype)
    position[mod] = np.arange(mod.size)
    enclosing = tree.inherit(position)
    parent = _parent_module(tree, mod, enclosing)
    depth = _depths(parent)
    path, path_parent, path_name = _paths(events.name[mod], parent, depth)
    # The profiler's and torchscope's own frames inside a call (torchscope run's step hook runs in the
    # loop's top-level module's forward pre-hook) are measurement, not the module's time.
    host_us = events.dur_us[mod] - _inclusive(_measurement_us(events, tree, mod, enclosing), parent, depth)
    has_parent = parent >= 0
    self_us = host_us - np.bincount(parent[has_parent], weights=host_us[has_parent], minlength=mod.size)
    device_us = _device_inclusive(events, enclosing, mod, parent, depth)
    # A call counts in the step that holds its end. Under `torchscope run` a step starts in the forward
    # pre-hook of the loop's top-level module, so that call's frame opens just before its step; and the
    # recording stops inside the first call of the step after the last.
    chosen = steps.index_holding_end(events.ts_us[mod] + events.dur_us[mod]) >= 0
    n = len(path_name)
    p = path[chosen]
    calls = np.bincount(p, minlength=n)
    totals = [np.bincount(p, weights=w[chosen], minlength=n) for w in (host_us, np.maximum(self_us, 0.0), device_us)]
    names = [events.strings[i][len(MODULE_PREFIX):] for i in path_name]
    texts: list[str] = []
    depths: list[int] = []
    for i, up in enumerate(path_parent):  # one per distinct path; parents come first
        texts.append(names[i] if up < 0 else f"{texts[up]}/{names[i]}")
        depths.append(0 if up < 0 else depths[up] + 1)
    rows = [
        ModuleTotals(path=texts[i], module=names[i].rsplit("_", 1)[0], depth=depths[i], calls=int(calls[i]),
                     host_us=float(totals[0][i]), host_self_us=float(totals[1][i]), device_us=float(totals[2][i]))
        for i in np.flatnonzero(calls).tolist()
    ]
    return sorted(rows, key=lambda r: (-r.host_us, r.path))


def _parent_module(tree: HostTree, mod: np.ndarray, enclosing: np.ndarray) -> np.ndarray:
    """For each module call (position in `mod`), the position of the module call enclosing it (-1: none);
    `enclosing`: each event's nearest module call, ancestor-or-self, as a position in `mod`."""
    up = tree.parent[mod]
    return np.where(up >= 0, enclosing[np.maximum(up, 0)], -1).astype(np.int64)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Module nesting depth of each call (0: no enclosing module), one vectorised pass per level."""
    depth = np.where(parent < 0, 0, -1)
    level = 0
    while (depth < 0).any():
        ready = (depth < 0) & (depth[np.maximum(parent, 0)] == level)
        if not ready.any():  # cannot happen in a tree; guards against a malformed one
            depth[depth < 0] = 0
            break
        level += 1
        depth[ready] = level
    return depth


def _paths(name: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, list[int], list[int]]:
    """A path id per call, and per path id its parent path id (-1 at the top) and its name id."""
    path = np.full(name.size, -1, dtype=np.int64)
    path_parent: list[int] = []
    path_name: list[int] = []
    for level in range(int(depth.max()) + 1):
        at = np.flatnonzero(depth == level)
        up = np.where(parent[at] >= 0, path[np.maximum(parent[at], 0)], -1)
        # (parent path, name) as one int64, which sorts as the pairs do (string ids < 2**32): grouped in
        # one dimension, many times faster than np.unique(axis=1) on the stacked pair.
        keys, inverse = group_ids(((up + 1) << 32) | name[at].astype(np.int64))
        path[at] = inverse.reshape(-1) + len(path_parent)
        path_parent += ((keys >> 32) - 1).tolist()
        path_name += (keys & 0xFFFFFFFF).tolist()
    return path, path_parent, path_name


def _device_inclusive(events: EventTable, enclosing: np.ndarray, mod: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Device time of the kernels launched inside each module call, its child modules' included
    (`enclosing`: as for `_parent_module`)."""
    device = events.kind_rows(DEVICE_KINDS)
    own = np.zeros(mod.size)
    if device.size == 0:
        return own
    launcher = launcher_of_device_events(events, device)
    launched = launcher >= 0
    owner = enclosing[launcher[launched]]
    inside = owner >= 0
    own += np.bincount(owner[inside], weights=events.dur_us[device[launched]][inside], minlength=mod.size)
    return _inclusive(own, parent, depth)


def _measurement_us(events: EventTable, tree: HostTree, mod: np.ndarray, enclosing: np.ndarray) -> np.ndarray:
    """Per module call, the time of the outermost measurement frames (`is_measurement_frame`) it holds
    directly, not inside a child module (`enclosing`: as for `_parent_module`)."""
    own = np.zeros(mod.size)
    measurement = events.kind_mask(Kind.PYTHON_FUNCTION) & events.name_mask(is_measurement_frame)
    frames = np.flatnonzero(measurement)
    if frames.size == 0:
        return own
    # Outermost inside its module call: the nearest measurement frame or module call above it is a module
    # call (built-in calls can sit between nested measurement frames; and under `torchscope run` the whole
    # script runs inside torchscope's runner frames, so any ancestor up the stack does not tell).
    stop = measurement.copy()
    stop[mod] = True
    up = tree.parent[frames].astype(np.int64)
    while (climb := (up >= 0) & ~stop[np.maximum(up, 0)]).any():
        up[climb] = tree.parent[up[climb]]
    frames = frames[(up < 0) | ~measurement[np.maximum(up, 0)]]
    # A measurement frame that holds module calls (a closure's wrapper around the forward) is not taken off:
    # the calls inside are the module's time, and their own measurement frames are counted in them.
    frames = frames[~_holds_module_calls(tree, measurement, mod)[frames]]
    owner = enclosing[frames]
    inside = owner >= 0
    own += np.bincount(owner[inside], weights=events.dur_us[frames[inside]], minlength=mod.size)
    return own


def _holds_module_calls(tree: HostTree, measurement: np.ndarray, mod: np.ndarray) -> np.ndarray:
    """Per event: a measurement frame with a module call below it, up to the next module call above that
    call (climbed from the module calls, one level per iteration)."""
    holds = np.zeros(measurement.size, dtype=bool)
    is_module = np.zeros(measurement.size, dtype=bool)
    is_module[mod] = True
    up = tree.parent[mod].astype(np.int64)
    while (live := (up >= 0)).any():
        up = up[live]
        up = up[~is_module[up]]
        holds[up[measurement[up]]] = True
        up = tree.parent[up].astype(np.int64)
    return holds


def _inclusive(own: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Per module call, its own value plus its child calls' (inclusive), deepest first."""
    total = own.copy()
    if not total.any():
        return total
    for level in range(int(depth.max()), 0, -1):
        at = np.flatnonzero(depth == level)
        np.add.at(total, parent[at], total[at])
    return total


def extract_modules(span: SpanInput) -> ModuleTable:
    return ModuleTable(rows=module_rows(span.events, span.tree, span.steps))


def reduce_modules(parts: list[Part[ModuleTable]]) -> dict[str, Any]:
    """Rows merged by path over every span and rank, as means per step."""
    steps = sum(max(p.key.steps, 1) for p in parts)
    merged: dict[str, ModuleTotals] = {}
    for part in parts:
        for row in part.value.rows:
            seen = merged.setdefault(row.path, msgspec.structs.replace(row, calls=0, host_us=0.0, host_self_us=0.0, device_us=0.0))
            seen.calls += row.calls
            seen.host_us += row.host_us
            seen.host_self_us += row.host_self_us
            seen.device_us += row.device_us
    rows = [
        ModuleRow(
            path=t.path, module=t.module, depth=t.depth, calls=t.calls, calls_per_step=t.calls / steps,
            host_us_per_step=t.host_us / steps, host_self_us_per_step=t.host_self_us / steps,
            device_us_per_step=t.device_us / steps,
        )
        for t in merged.values()
    ]
    return {"modules": sorted(rows, key=lambda r: (-r.host_us_per_step, r.path))}


MODULES = Analysis(name="modules", extract=extract_modules, extract_type=ModuleTable, reduce=reduce_modules, fills=("modules",))
