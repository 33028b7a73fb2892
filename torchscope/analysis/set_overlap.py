"""How much of each window several disjoint interval sets cover: `intervals.overlap_per_window_of_each`'s
figures, to the bit, for many windows at once (the host events of a trace against its phases).

Both ends of a window are found among all the sets' intervals merged in start order. A set's covered
length before a point p is the set's summed length before the last interval starting at or before p,
plus the part of that interval before p when it is the set's own. So when both ends of a window fall
after the same interval (most events: short, inside one phase range), only that interval's set covers
any of it, and the others' figures are exactly 0; the windows that straddle an interval start are the
only ones each set is computed for. Each figure keeps `intervals._covered_at`'s operations: the same
sums, in the same order, so the same floats.
"""

from __future__ import annotations

import numpy as np

from torchscope.analysis.intervals import IntervalSet


def overlap_of_each(sets: list[IntervalSet], window_starts: np.ndarray, window_ends: np.ndarray) -> np.ndarray:
    """Covered length of each of several mutually disjoint sets inside each window [ws, we), one row per
    set (`intervals.overlap_per_window_of_each`)."""
    ws = np.asarray(window_starts, dtype=np.float64)
    we = np.maximum(np.asarray(window_ends, dtype=np.float64), ws)
    out = np.zeros((len(sets), ws.size))
    if not sets:
        return out
    starts = np.concatenate([s[0] for s in sets])
    lengths = np.concatenate([s[1] for s in sets]) - starts
    owner = np.repeat(np.arange(len(sets)), [s[0].size for s in sets])
    keep = lengths > 0  # then no two intervals start at the same point
    order = np.argsort(starts[keep], kind="stable")
    starts, lengths, owner = starts[keep][order], lengths[keep][order], owner[keep][order]
    if starts.size == 0:
        return out
    before = _covered_before_each(len(sets), lengths, owner)
    own_before = before[owner, np.arange(1, owner.size + 1)]  # each interval's own set's sum before it
    # The last interval starting at or before each end; a window's end mostly lies before the next start.
    last_ws = np.searchsorted(starts, ws, side="right") - 1
    at = np.maximum(last_ws, 0)
    within = we < np.append(starts, np.inf)[last_ws + 1]
    across = np.flatnonzero(~within)
    last_we = last_ws.copy()
    last_we[across] = np.searchsorted(starts, we[across], side="right") - 1
    # Each end's cover by the set of its last interval: the part of that interval before it, plus the
    # set's sum before that interval (`intervals._covered_at`'s terms).
    start_at, length_at, before_at = starts[at], lengths[at], own_before[at]
    covered_ws = np.minimum(ws - start_at, length_at) + before_at
    covered_we = np.minimum(we - start_at, length_at) + before_at
    # Both ends after the same interval: only its set's cover grows in between.
    inside = np.flatnonzero(within & (last_ws >= 0))
    out.reshape(-1)[owner[at[inside]] * ws.size + inside] = covered_we[inside] - covered_ws[inside]
    if across.size:
        # Straddling windows: each set's cover at an end is its sum before the end's last interval, plus,
        # for that interval's own set, the part of it before the end (computed above for the starts).
        at_we = np.maximum(last_we[across], 0)
        covered_we = np.minimum(we[across] - starts[at_we], lengths[at_we]) + own_before[at_we]
        cover_at = []
        for last, clipped, covered in ((last_ws[across], at[across], covered_ws[across]), (last_we[across], at_we, covered_we)):
            cover = before[:, last + 1]  # sets x windows
            has = np.flatnonzero(last >= 0)
            cover[owner[clipped[has]], has] = covered[has]
            cover_at.append(cover)
        out[:, across] = cover_at[1] - cover_at[0]
    return out


def _covered_before_each(n_sets: int, lengths: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per set, its summed length before each merged interval, at column (interval + 1); column 0 (before
    every interval) is 0. Each set's running sum passes over the others' intervals as zeros, as in
    `intervals._covered_at`: adding 0.0 leaves a sum's bits as they are."""
    before = np.zeros((n_sets, lengths.size + 1))
    for i in range(n_sets):
        np.cumsum(np.where(owner == i, lengths, 0.0)[:-1], out=before[i, 2:])
    return before
