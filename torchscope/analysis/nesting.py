"""Host call trees: which host event encloses which, per thread, computed with numpy.

For each thread, events are ordered by (start, longer first). The depth of an event is the number of
earlier events still open when it starts; its parent is the nearest earlier event one level up. Both come
from sorted searches, not from a Python stack walk.
"""

from __future__ import annotations

from functools import cached_property

import msgspec
import numpy as np

from torchscope.arrays import count_at_or_below, read_only
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable

NESTED_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER)
MAX_TREE_DEPTH = 1024  # < 2**15: `HostTree.levels` sorts depths as int16


class HostTree(msgspec.Struct, frozen=True, dict=True):
    """Parent (event index, -1 for roots and non-host events) and depth (-1 for non-host) per event."""

    # dict=True: the cached_property values (`levels`, `linked`) are kept in the instance __dict__.
    parent: np.ndarray
    depth: np.ndarray

    @cached_property
    def levels(self) -> list[np.ndarray]:
        """Event indices per depth (index d: the events at depth d), from one sort instead of a full
        scan per level; computed once per tree."""
        # Depths are at most MAX_TREE_DEPTH: as int16 the stable sort is a radix sort (the same order).
        order = np.argsort(self.depth.astype(np.int16), kind="stable").astype(self.parent.dtype, copy=False)
        sorted_depth = self.depth[order]
        top = int(sorted_depth[-1]) if sorted_depth.size else -1
        bounds = np.searchsorted(sorted_depth, np.arange(top + 2))
        return [order[bounds[d] : bounds[d + 1]] for d in range(top + 1)]

    @cached_property
    def linked(self) -> list[np.ndarray]:
        """The events that have a parent, per depth from 1 down: each level itself (no copy), or its
        events with a parent where a few have none (see `_open_parents`); computed once per tree, for
        every pass down or up it."""
        out = []
        for at_level in self.levels[1:]:
            has_parent = self.parent[at_level] >= 0
            out.append(at_level if has_parent.all() else at_level[has_parent])
        return out

    def inherit(self, own: np.ndarray, missing: int = -1) -> np.ndarray:
        """Propagate a per-event label down the tree: events without their own label take the
        nearest ancestor's (processed level by level, each level vectorised)."""
        labels = own.copy()
        for children in self.linked:
            unset = children[labels[children] == missing]
            labels[unset] = labels[self.parent[unset]]
        return labels


def host_tree(events: EventTable) -> HostTree:
    """The table's host tree, built once per table (the span's analyses and the phase masks share it)."""
    return events.memo("host_tree", lambda: build_host_tree(events))


def build_host_tree(events: EventTable) -> HostTree:
    n = len(events)
    index = np.int32 if n < 2**31 else np.int64  # half the memory of int64 for any real trace
    parent = np.full(n, -1, dtype=index)
    depth = np.full(n, -1, dtype=np.int32)
    host = events.kind_rows(NESTED_KINDS)
    if host.size == 0:
        return HostTree(parent, depth)
    thread_key = (events.pid[host].astype(np.int64) << 32) | events.tid[host].astype(np.int64)
    ts = events.ts_us[host]
    dur = events.dur_us[host]
    order = tree_order(thread_key, ts, dur)
    host, thread_key, ts, dur = host[order], thread_key[order], ts[order], dur[order]
    boundaries = np.flatnonzero(np.diff(thread_key)) + 1
    kind = events.kind[host]
    for lo, hi in zip(np.r_[0, boundaries], np.r_[boundaries, host.size]):
        idx, t, d_ = host[lo:hi], ts[lo:hi], dur[lo:hi]
        p, d = _thread_tree(t, d_)
        end = t + d_
        start = _ranges_after_their_calls(end, p, t, kind[lo:hi])
        if start is not None:  # ranges that outlive the Python call that opened them: nest them beside it
            order = tree_order(np.zeros(t.size, dtype=np.int64), start, end - start)
            idx = idx[order]
            p, d = _thread_tree(start[order], (end - start)[order])
        depth[idx] = d
        parent[idx] = np.where(p >= 0, idx[np.maximum(p, 0)], -1)
    # Passes over the tree go level by level; a hostile trace (e.g. 100k identical events, each "inside"
    # the previous one) would make them quadratic. Real traces nest tens of levels (Python stacks stay under
    # the interpreter's recursion limit), so events deeper than this are left out of the tree.
    too_deep = depth > MAX_TREE_DEPTH
    parent[too_deep] = -1
    depth[too_deep] = -1
    return HostTree(parent, depth)


# A range that outlives the Python call it opens in by more than this is moved out of that call; less is
# clock disagreement between the Python tracer and the profiler's ranges (see `_open_parents`).
OUTLIVES_US = 1.0


def _ranges_after_their_calls(end: np.ndarray, parent: np.ndarray, ts: np.ndarray, kind: np.ndarray) -> np.ndarray | None:
    """Starts for a second pass of one thread's tree (ordered as `_thread_tree` takes it), or None when no
    range needs one.

    With Python stacks, a `record_function` range (`ProfilerStep#N`, torch's `Optimizer.step#...`,
    torchscope's phase labels, the user's own) opens inside its own `__enter__` call (`__enter__` >
    `torch/_ops.py: __call__` > `_record_function_enter_new`, and for `ProfilerStep#N` the `step()` calls
    around them) and outlives it. Counting the events open at its start puts the range under those calls,
    and what runs inside it, which starts after they returned, finds no parent at the level above and
    hangs from the frame that entered the range: a user range's self time was its whole duration. Such a
    range here starts where the outermost Python call it outlives ends, so that it nests beside the calls
    (and any call nested in them that its parent chain misses) and its contents inside it. Its `__exit__`
    calls, which start inside it and end just after it, stay its children: a few microseconds."""
    python = kind == Kind.PYTHON_FUNCTION
    ranges = np.flatnonzero((parent >= 0) & (kind == Kind.USER_ANNOTATION))
    ranges = ranges[python[parent[ranges]] & (end[parent[ranges]] < end[ranges] - OUTLIVES_US)]
    if ranges.size == 0:
        return None
    call = parent[ranges]
    while True:  # up through the Python calls the range outlives: the last one is the outermost
        up = parent[call]
        safe = np.maximum(up, 0)
        climb = (up >= 0) & python[safe] & (end[safe] < end[ranges] - OUTLIVES_US)
        if not climb.any():
            break
        call = np.where(climb, up, call)
    start = ts.copy()
    start[ranges] = end[call]
    return start


def tree_order(thread_key: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """`np.lexsort((-dur, ts, thread_key))`, in a fraction of its time on real traces.

    Why: lexsort makes three full sorting passes. Events mostly come in start order, so a stable sort by
    start is nearly a merge; only runs of equal starts need the second key (longer first), and the thread
    is a stable sort on an integer key that is already grouped in runs. Both stable, so ties keep the
    original order exactly as lexsort's. With many tied starts the extra pass costs more: lexsort then."""
    if np.isnan(ts).any():  # NaN starts tie with each other in lexsort, not in the comparison below
        return np.lexsort((-dur, ts, thread_key))
    order = np.argsort(ts, kind="stable")
    sorted_ts = ts[order]
    new_start = np.empty(order.size, dtype=bool)
    new_start[:1] = True
    np.not_equal(sorted_ts[1:], sorted_ts[:-1], out=new_start[1:])
    tied = ~new_start
    tied[:-1] |= ~new_start[1:]  # the first event of each run of equal starts too
    in_runs = np.flatnonzero(tied)
    if in_runs.size > order.size // 4:
        return np.lexsort((-dur, ts, thread_key))
    if in_runs.size:
        run = np.cumsum(new_start)[in_runs]
        order[in_runs] = order[in_runs[np.lexsort((-dur[order[in_runs]], run))]]
    return order[np.argsort(thread_key[order], kind="stable")]


def _thread_tree(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Local parent positions and depths for one thread's events, sorted by (ts, -dur)."""
    n = ts.size
    end = ts + dur
    position = np.arange(n)
    # Events that closed at or before my start: all of them precede me in order, except zero-length
    # events sharing my start and sorted after me.
    closed = count_at_or_below(end, ts)
    depth = np.maximum(position - (closed - _zero_length_after(ts, dur, position)), 0)
    return _open_parents(_level_parents(depth), ts, end), depth


def _zero_length_after(ts: np.ndarray, dur: np.ndarray, position: np.ndarray) -> np.ndarray | int:
    """Per event: the zero-length events that share its start and sort after it (itself included when
    zero-length), which `closed` counts though they do not precede it."""
    zero = dur == 0
    zero_positions = np.flatnonzero(zero)
    if zero_positions.size == 0:
        return 0
    zero_ts = ts[zero]
    zeros_at_my_ts = np.searchsorted(zero_ts, ts, side="right") - np.searchsorted(zero_ts, ts, side="left")
    # Zero-length events sharing my start that sort before me (they sort after every longer event).
    zeros_before_me = np.searchsorted(zero_positions, position) - np.searchsorted(zero_ts, ts, side="left")
    return zeros_at_my_ts - np.where(zero, zeros_before_me, 0)


def _level_parents(depth: np.ndarray) -> np.ndarray:
    """Parent: the latest earlier event one level up (-1 for none). Searched level by level, each level's
    positions among the level above's (both ascending, from one radix sort of the depths): short
    searches, not one over all events; but one search when there are many levels (a Python step each)."""
    if depth.size == 0 or depth.max() > _LEVELS_SEARCHED_APART:
        return _parents_in_one_search(depth)
    parent = np.full(depth.size, -1, dtype=np.int64)
    order = np.argsort(depth.astype(np.int16), kind="stable")  # small ints: a radix sort
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    for d in range(1, bounds.size - 1):
        above, mine = order[bounds[d - 1] : bounds[d]], order[bounds[d] : bounds[d + 1]]
        if above.size == 0:  # overlapping, not nested, events can skip a level: no parent then
            continue
        j = np.searchsorted(above, mine) - 1
        parent[mine] = np.where(j >= 0, above[np.maximum(j, 0)], -1)
    return parent


_LEVELS_SEARCHED_APART = 256  # real traces nest tens of levels


def _parents_in_one_search(depth: np.ndarray) -> np.ndarray:
    """`_level_parents` for any depths: every event's (depth - 1, position) among all (depth, position)."""
    n = depth.size
    position = np.arange(n)
    sorted_keys = np.sort(depth * n + position)
    j = np.searchsorted(sorted_keys, (depth - 1) * n + position, side="left") - 1
    candidate = sorted_keys[np.maximum(j, 0)]
    valid = (depth > 0) & (j >= 0) & (candidate // max(n, 1) == depth - 1)
    return np.where(valid, candidate % max(n, 1), -1)


def _open_parents(parent: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Where events overlap without nesting (Python tracer and operator clocks disagree by a microsecond,
    a range closed late), the level count can name as parent an event that ended before the child began.
    Such a child moves up to the nearest ancestor still open at its start; ancestors sit at lower depths,
    so the level-by-level passes stay valid."""
    closed = np.flatnonzero((parent >= 0) & (end[np.maximum(parent, 0)] < ts))
    while closed.size:
        up = parent[parent[closed]]
        parent[closed] = up
        closed = closed[(up >= 0) & (end[np.maximum(up, 0)] < ts[closed])]
    return parent


def accumulate_up(tree: HostTree, values: np.ndarray) -> np.ndarray:
    """Inclusive totals: each event's value plus all its descendants' (deepest level first)."""
    totals = values.astype(np.float64)  # a copy (astype copies)
    last_child = np.empty(totals.size, dtype=np.intp)  # scratch: per parent, one of its children's slots
    for children in reversed(tree.linked):
        parents = tree.parent[children]
        # Each parent's children are summed in one bin, in their order (as a sort by parent would group
        # them): the bin is the slot of its last child in this level, found without sorting.
        last_child[parents] = np.arange(parents.size)
        slot = last_child[parents]
        sums = np.bincount(slot, weights=totals[children], minlength=parents.size)
        one = np.flatnonzero(slot == np.arange(parents.size))  # one slot per distinct parent
        totals[parents[one]] += sums[one]
    return totals


def has_ancestor_in(tree: HostTree, mask: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: whether one of its ancestors is in `mask`, climbing from these rows only (a few
    levels each; `nearest_ancestor_of` walks the whole tree)."""
    found = np.zeros(rows.size, dtype=bool)
    ancestor = tree.parent[rows].astype(np.int64)
    while (live := (ancestor >= 0) & ~found).any():
        found[live] = mask[ancestor[live]]
        ancestor[live] = tree.parent[ancestor[live]]
    return found


def nearest_ancestor_of(tree: HostTree, mask: np.ndarray) -> np.ndarray:
    """For each event, the index of the nearest ancestor-or-self in `mask` (-1 if none)."""
    own = np.where(mask, np.arange(mask.size, dtype=tree.parent.dtype), -1)
    return tree.inherit(own)


def self_time_us(dur_us: np.ndarray, parent: np.ndarray, child_mask: np.ndarray) -> np.ndarray:
    """Duration minus the durations of the children in `child_mask`, by `parent` (the tree's, or
    `operator_parent`)."""
    counted = child_mask & (parent >= 0)
    children_time = np.bincount(parent[counted], weights=dur_us[counted], minlength=dur_us.size)
    self_time = np.subtract(dur_us, children_time, dtype=np.float64)  # (bincount of no rows is int64 zeros)
    return np.maximum(self_time, 0.0, out=self_time)  # in place: one array of every event's float64 fewer


def operator_parent(events: EventTable, tree: HostTree) -> np.ndarray:
    """For each host event that is not a Python frame, its nearest enclosing host event that is not one
    either (-1 if none): its parent as PyTorch's own operator tables see it (Python frames keep the tree's
    parent). With `with_stack=True` Python frames sit between an operator and the operators it calls
    whenever it runs Python (an autograd.Function such as a compiled graph's `CompiledFunction`, hooks, the
    optimizer's step): which operators an operator calls is found through them (a leaf calls none). Kept per
    table (read-only)."""
    return events.memo("operator_parent", lambda: read_only(_operator_parent(events.kind, tree)))


def _operator_parent(kind: np.ndarray, tree: HostTree) -> np.ndarray:
    parent = tree.parent.copy()
    # Only events under a Python frame climb, one level per iteration, past the frames.
    climbing = np.flatnonzero((parent >= 0) & (kind != Kind.PYTHON_FUNCTION))
    while climbing.size:
        climbing = climbing[kind[parent[climbing]] == Kind.PYTHON_FUNCTION]
        parent[climbing] = tree.parent[parent[climbing]]
        climbing = climbing[parent[climbing] >= 0]
    return parent


def calling_frame(tree: HostTree, kind: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """For each of `rows`, the nearest ancestor that is a Python function: the code that made the call,
    past the ranges (`ProfilerStep#N`, a user's `record_function`) it runs inside; -1 if none. Walks up
    from just those rows, one level per iteration."""
    frame = tree.parent[rows].astype(np.int64)
    while True:
        climb = (frame >= 0) & (kind[np.maximum(frame, 0)] != Kind.PYTHON_FUNCTION)
        if not climb.any():
            return frame
        frame = np.where(climb, tree.parent[np.maximum(frame, 0)], frame)


def outermost_ancestor_of(tree: HostTree, mask: np.ndarray, events_of_interest: np.ndarray) -> np.ndarray:
    """For each event in `events_of_interest`, the outermost ancestor-or-self in `mask` (-1 if none):
    e.g. the `aten::item` a user called rather than the `_local_scalar_dense` inside it. Walks up the
    parent pointers of just those events, one level per iteration."""
    current = np.asarray(events_of_interest, dtype=np.int64)
    result = np.where(mask[current], current, -1)
    while True:
        alive = current >= 0
        if not alive.any():
            return result
        current = np.where(alive, tree.parent[np.maximum(current, 0)], -1)
        hit = (current >= 0) & mask[np.maximum(current, 0)]
        result = np.where(hit, current, result)


def launcher_of_device_events(events: EventTable, device: np.ndarray) -> np.ndarray:
    """The host runtime call (event index) that launched each device event, by correlation id (read-only
    for the table's device rows: steps, modules, operators and whatif all ask for those, so their answer
    is kept per table: one int64 per device event)."""
    every = events.kind_rows(DEVICE_KINDS)
    if device.size == every.size and (device is every or np.array_equal(device, every)):
        return events.memo("launchers_of_device_rows", lambda: read_only(_launchers(events, every)))
    return _launchers(events, device)


def _launchers(events: EventTable, device: np.ndarray) -> np.ndarray:
    corr, runtime = events.memo("launchers_by_correlation", lambda: _launchers_by_correlation(events))
    launcher = np.full(device.size, -1, dtype=np.int64)
    if runtime.size == 0 or device.size == 0:
        return launcher
    wanted = events.correlation[device]
    pos = np.minimum(np.searchsorted(corr, wanted), corr.size - 1)
    found = (corr[pos] == wanted) & (wanted >= 0)
    launcher[found] = runtime[pos[found]]
    return launcher


def _launchers_by_correlation(events: EventTable) -> tuple[np.ndarray, np.ndarray]:
    """The runtime and driver calls with a correlation id, by id (once per table: several analyses ask)."""
    runtime = events.kind_rows((Kind.RUNTIME, Kind.DRIVER))
    runtime = runtime[events.correlation[runtime] >= 0]
    corr = events.correlation[runtime]
    order = np.argsort(corr, kind="stable")
    return corr[order], runtime[order]
