"""Vectorised interval arithmetic on half-open [start, end) intervals in microseconds.

An *interval set* is a pair of sorted float arrays (starts, ends) with no overlaps; `union` makes one
from arbitrary intervals. Everything here is numpy: no Python loop over intervals.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

IntervalSet = tuple[np.ndarray, np.ndarray]

EMPTY: IntervalSet = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> IntervalSet:
    """Merge possibly overlapping intervals into a disjoint sorted set (zero-length ones vanish)."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    if not keep.all():  # copies only when some interval is empty (most sets have none)
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    if not (starts[1:] >= starts[:-1]).all():  # events mostly come in start order: no sort needed then
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    running_end = np.maximum.accumulate(ends)
    # A new merged interval begins where the start is past every earlier end.
    new_group = np.empty(starts.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > running_end[:-1]
    group_starts = starts[new_group]
    last_in_group = np.append(np.flatnonzero(new_group)[1:] - 1, starts.size - 1)
    return group_starts, running_end[last_in_group]


def total_length(intervals: IntervalSet) -> float:
    return float(np.sum(intervals[1] - intervals[0]))


def _covered_before(intervals: IntervalSet, points: np.ndarray) -> np.ndarray:
    """Covered length of the set in (-inf, p) for each point p."""
    starts, ends = intervals
    if starts.size == 0:
        return np.zeros(np.shape(points))
    lengths = ends - starts
    cumulative = np.empty(starts.size)  # covered length before each interval
    cumulative[0] = 0.0
    np.cumsum(lengths[:-1], out=cumulative[1:])
    last = np.searchsorted(starts, points, side="right") - 1  # the last interval starting at or before p
    before = last < 0
    np.maximum(last, 0, out=last)
    # p is at or past that interval's start, so the part of it before p is min(p - start, length).
    covered = np.minimum(points - starts[last], lengths[last])
    covered += cumulative[last]
    covered[before] = 0.0
    return covered


def covered_before(intervals: IntervalSet, points: np.ndarray) -> np.ndarray:
    """Covered length of the set before each point (how far a point moves when the set is removed)."""
    return _covered_before(intervals, np.asarray(points, dtype=np.float64))


def overlap_per_window(intervals: IntervalSet, window_starts: np.ndarray, window_ends: np.ndarray) -> np.ndarray:
    """Covered length of the set inside each window [ws, we)."""
    ws = np.asarray(window_starts, dtype=np.float64)
    we = np.maximum(np.asarray(window_ends, dtype=np.float64), ws)
    return _covered_before(intervals, we) - _covered_before(intervals, ws)


def overlap_per_window_sparse(intervals: IntervalSet, window_starts: np.ndarray, window_ends: np.ndarray) -> np.ndarray:
    """`overlap_per_window`, the same figures, for many windows of which most miss the set (host events
    against device-idle gaps): one search finds the windows that meet it, and only those are measured.
    A window that meets no interval lies in one uncovered stretch, where the covered length before
    either edge is the same sum, so `overlap_per_window` gives it exactly 0.0 too."""
    starts, ends = intervals
    ws = np.asarray(window_starts, dtype=np.float64)
    we = np.maximum(np.asarray(window_ends, dtype=np.float64), ws)
    out = np.zeros(ws.size)
    if starts.size == 0:
        return out
    following = np.searchsorted(ends, ws, side="right")  # the first interval ending after the window starts
    meets = np.flatnonzero((following < starts.size) & (starts[np.minimum(following, starts.size - 1)] < we) & (ws < we))
    out[meets] = _covered_before(intervals, we[meets]) - _covered_before(intervals, ws[meets])
    return out


def overlap_per_window_of_each(sets: list[IntervalSet], window_starts: np.ndarray, window_ends: np.ndarray) -> np.ndarray:
    """`overlap_per_window` of each of several mutually disjoint sets (e.g. `priority_partition`'s parts,
    the phases), one row per set, the same figures to the bit, for many windows at once (see
    `overlap_rows_of_each`)."""
    out = np.zeros((len(sets), np.size(window_starts)))
    for row, overlap in zip(out, overlap_rows_of_each(sets, window_starts, window_ends)):
        row[:] = overlap
    return out


def overlap_rows_of_each(sets: list[IntervalSet], window_starts: np.ndarray, window_ends: np.ndarray) -> Iterator[np.ndarray]:
    """The rows of `overlap_per_window_of_each`, one set's at a time, in the order of `sets`: a caller that
    reduces each row (a sum per name) holds one row of windows, not a (sets x windows) array, whose pages
    cost more to fault in than to fill.

    Both ends of a window are found among all the sets' intervals merged in start order. A set's covered
    length before a point p is the set's summed length before the last interval starting at or before p,
    plus the part of that interval before p when it is the set's own. So when both ends of a window fall
    after the same interval (most host events: short, inside one phase range), only that interval's set
    covers any of it, and the others' figures are exactly 0; the windows that straddle an interval start
    are the only ones each set is computed for."""
    if not sets:
        return
    ws = np.asarray(window_starts, dtype=np.float64)
    we = np.maximum(np.asarray(window_ends, dtype=np.float64), ws)
    starts = np.concatenate([s[0] for s in sets])
    lengths = np.concatenate([s[1] for s in sets]) - starts
    owner = np.repeat(np.arange(len(sets)), [s[0].size for s in sets])
    keep = lengths > 0  # then no two intervals start at the same point
    order = np.argsort(starts[keep], kind="stable")
    starts, lengths, owner = starts[keep][order], lengths[keep][order], owner[keep][order]
    if starts.size == 0:
        for _ in sets:
            yield np.zeros(ws.size)
        return
    before = _covered_before_each(len(sets), lengths, owner)
    own_before = before[owner, np.arange(1, owner.size + 1)]  # each interval's own set's sum before it

    def own_cover(points: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Cover at each point by the set of its last interval (`last`, >= 0): the part of that interval
        before it, plus the set's sum before that interval (as `_covered_before` takes them)."""
        return np.minimum(points - starts[last], lengths[last]) + own_before[last]

    # The last interval starting at or before each start; a window's end mostly lies before the next start.
    last_ws = np.searchsorted(starts, ws, side="right") - 1
    within = we < np.append(starts, np.inf)[last_ws + 1]
    # Both ends after the same interval: only its set's cover grows in between.
    inside = np.flatnonzero(within & (last_ws >= 0))
    at = last_ws[inside]
    inside_owner, inside_overlap = owner[at], own_cover(we[inside], at) - own_cover(ws[inside], at)
    del at
    # Straddling windows: each set's cover at an end is its sum before the end's last interval, plus, for
    # that interval's own set, the part of it before the end.
    across = np.flatnonzero(~within)
    cover_at = []
    last_we = np.searchsorted(starts, we[across], side="right") - 1
    for points, last in ((ws[across], last_ws[across]), (we[across], last_we)):
        cover = before.take(last + 1, axis=1)  # sets x windows (take: a fraction of before[:, i]'s time)
        has = np.flatnonzero(last >= 0)
        cover.reshape(-1)[owner[last[has]] * across.size + has] = own_cover(points[has], last[has])  # flat: faster than [rows, cols]
        cover_at.append(cover)
    across_overlap = cover_at[1] - cover_at[0]
    del last_ws, within, cover_at, before
    for i in range(len(sets)):
        row = np.zeros(ws.size)
        mine = inside_owner == i
        row[inside[mine]] = inside_overlap[mine]
        row[across] = across_overlap[i]
        yield row


def _covered_before_each(n_sets: int, lengths: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per set, its summed length before each merged interval, at column (interval + 1); column 0 (before
    every interval) is 0. Each set's running sum passes over the others' intervals as zeros: adding 0.0
    leaves a sum's bits as they are, so each is the sum `_covered_before` takes over the set alone."""
    before = np.zeros((n_sets, lengths.size + 1))
    for i in range(n_sets):
        np.cumsum(np.where(owner == i, lengths, 0.0)[:-1], out=before[i, 2:])
    return before


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Intersection of two disjoint sorted sets."""
    return _combine(a, b, _IN_BOTH)


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Parts of `a` not covered by `b`."""
    return _combine(a, b, _IN_A_ONLY)


# Coverage of an elementary piece between boundaries: 1 per set `a` covering it, 2 per set `b`.
_IN_A_ONLY, _IN_BOTH = 1, 3


def _combine(a: IntervalSet, b: IntervalSet, wanted: int) -> IntervalSet:
    """The pieces whose coverage (see above) is `wanted`, merged where they touch.

    One sweep: both sets' boundaries, each already in order, are merged by a stable sort (two sorted runs
    cost a merge, not a full sort); a running sum of +1/-1 (a) and +2/-2 (b) gives each piece's coverage.
    """
    if a[0].size == 0:
        return EMPTY
    points = np.concatenate((_boundaries(a), _boundaries(b)))
    steps = np.concatenate((np.tile(np.array([1, -1], np.int8), a[0].size), np.tile(np.array([2, -2], np.int8), b[0].size)))
    order = np.argsort(points, kind="stable")
    points = points[order]
    coverage = np.cumsum(steps[order], dtype=np.int32)[:-1]
    # Piece i is [points[i], points[i + 1]): boundaries sharing a position leave zero-length pieces, and
    # the coverage after the last of them is the one of the piece that follows.
    keep = np.flatnonzero((coverage == wanted) & (points[1:] > points[:-1]))
    if keep.size == 0:
        return EMPTY
    lefts, rights = points[keep], points[keep + 1]
    new_run = np.empty(keep.size, dtype=bool)
    new_run[0] = True
    np.greater(lefts[1:], rights[:-1], out=new_run[1:])  # pieces that touch merge, as in `union`
    last_in_run = np.append(np.flatnonzero(new_run)[1:] - 1, keep.size - 1)
    return lefts[new_run], rights[last_in_run]


def _boundaries(intervals: IntervalSet) -> np.ndarray:
    """start0, end0, start1, end1, ...: in order, for a disjoint sorted set."""
    starts, ends = intervals
    out = np.empty(2 * starts.size, dtype=np.float64)
    out[0::2] = starts
    out[1::2] = ends
    return out


def contains(intervals: IntervalSet, points: np.ndarray) -> np.ndarray:
    """Whether each point lies inside the set."""
    starts, ends = intervals
    if starts.size == 0:
        return np.zeros(points.shape, dtype=bool)
    i = np.searchsorted(starts, points, side="right") - 1
    return (i >= 0) & (points < ends[np.maximum(i, 0)])


def priority_partition(category_sets: list[IntervalSet], windows: IntervalSet) -> list[IntervalSet]:
    """Attribute each instant of `windows` to the first category (in list order) covering it.

    Returns one set per category plus a final set for the instants no category covers ("other").

    One sweep over every set's boundaries at once (a merge of sorted runs), not an intersect and a
    subtract per category, each over the whole remaining set: part k is the point set of windows and
    category k less categories 0..k-1, and both ways return it as its maximal intervals, whose ends are
    the same boundary values, so the results are identical."""
    if len(category_sets) > _MAX_SWEPT_SETS:
        return _priority_partition_by_steps(category_sets, windows)
    sets = [windows, *category_sets]
    points = np.concatenate([_boundaries(one) for one in sets])
    # Set i adds 2**i where one of its intervals opens and takes it back where it closes: as each set's
    # intervals are disjoint, the running sum after a boundary has bit i set while set i covers the piece
    # that follows (several boundaries at one point leave zero-length pieces, skipped below).
    steps = np.concatenate([np.tile(np.array([1 << i, -(1 << i)], np.int32), one[0].size) for i, one in enumerate(sets)])
    order = np.argsort(points, kind="stable")
    covering = np.cumsum(steps[order], dtype=np.int32)[:-1]
    del steps  # each temporary freed as soon as it is used: the sweep holds every set's boundaries
    points = points[order]
    del order
    inside = (covering & 1).astype(bool)  # pieces inside a window...
    inside &= points[1:] > points[:-1]  # ...of some length
    owner = _first_bit_table(len(category_sets))[covering[inside] >> 1]  # bit k: category k covers the piece
    lefts, rights = points[:-1][inside], points[1:][inside]
    del points, covering, inside
    runs = _merge_touching(lefts, rights, owner)
    del lefts, rights, owner
    return _split_by_owner(*runs, len(category_sets) + 1)


_MAX_SWEPT_SETS = 16  # categories as bits: a table of 2**16 owners at most


def _first_bit_table(bits: int) -> np.ndarray:
    """For each value below 2**bits: its lowest set bit (the first category covering a piece), `bits`
    for 0 (no category: "other")."""
    values = np.arange(1 << bits)
    first = np.full(values.size, bits, dtype=np.int16)
    for k in reversed(range(bits)):
        first[(values >> k) & 1 == 1] = k
    return first


def _merge_touching(lefts: np.ndarray, rights: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces [lefts[i], rights[i]) (in order, disjoint) merged where they touch and have one owner:
    touching pieces of one owner are neighbours (pieces between them would be empty)."""
    if lefts.size == 0:
        return lefts, rights, owner
    new_run = np.empty(lefts.size, dtype=bool)
    new_run[0] = True
    np.greater(lefts[1:], rights[:-1], out=new_run[1:])
    new_run[1:] |= owner[1:] != owner[:-1]
    run_ends = np.append(new_run[1:], True)
    return lefts[new_run], rights[run_ends], owner[new_run]


def _split_by_owner(lefts: np.ndarray, rights: np.ndarray, owner: np.ndarray, n_owners: int) -> list[IntervalSet]:
    """The intervals [lefts[i], rights[i]) (in order), one set per owner, each in order."""
    by_owner = np.argsort(owner, kind="stable")  # int16: a radix sort, each owner's intervals stay in order
    bounds = np.searchsorted(owner[by_owner], np.arange(n_owners + 1))
    runs = [by_owner[bounds[k] : bounds[k + 1]] for k in range(n_owners)]
    return [(lefts[r], rights[r]) if r.size else EMPTY for r in runs]


def _priority_partition_by_steps(category_sets: list[IntervalSet], windows: IntervalSet) -> list[IntervalSet]:
    """`priority_partition` one category at a time (any number of categories)."""
    remaining = windows
    parts: list[IntervalSet] = []
    for category in category_sets:
        part = intersect(remaining, category)
        parts.append(part)
        remaining = subtract(remaining, part)
    parts.append(remaining)
    return parts
