"""Small numpy helpers shared by the loader and the analyses."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array: `np.unique(values)` (for floats, NaNs are not merged
    into one as np.unique merges them; the callers pass ids).

    Why not np.unique: since numpy 2.3 its plain form imports numpy.ma on first use (about 10 ms of a
    process's start, which a half-second analysis notices); the forms with return_inverse or
    return_counts do not, and neither does this."""
    ordered = np.sort(np.asarray(values).ravel())
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def group_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(ids, return_inverse=True)` for non-negative integer ids (string ids of a column): the
    distinct ids in order and each element's position among them, from a table over the ids instead of a
    sort (np.unique's argsort is most of its time). Ids much larger than their count are sorted as before."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.size == 0 or ids.min() < 0 or ids.max() > 4 * ids.size + 4096:
        return np.unique(ids, return_inverse=True)
    present = np.zeros(int(ids.max()) + 1, dtype=bool)
    present[ids] = True
    position = np.cumsum(present) - 1
    return np.flatnonzero(present).astype(ids.dtype, copy=False), position[ids]



def group_pairs(high: np.ndarray, low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`group_ids((high << 32) | low)` for two columns of non-negative ids below 2**31 (e.g. an op's name
    and input-shape string ids): the distinct 64-bit keys in order, and each pair's position among them.
    Each column is ranked through `group_ids`' table, then the pairs of ranks, which are small, the same
    way: no sort of 64-bit keys (ranks keep the ids' order, so the keys come out as a sort orders them)."""
    highs, high_rank = group_ids(np.asarray(high))
    lows, low_rank = group_ids(np.asarray(low))
    if lows.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.intp)
    codes, group = group_ids(high_rank.astype(np.int64) * lows.size + low_rank)
    keys = (highs[codes // lows.size].astype(np.int64) << 32) | lows[codes % lows.size].astype(np.int64)
    return keys, group

def count_at_or_below(values: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For each of `points`, which must be ascending: how many of `values` (in any order) are <= it.
    `np.searchsorted(np.sort(values), points, side="right")`, from one stable sort of both together (a
    merge where `values` is nearly sorted) instead of a sort and a binary search per point; NaNs count as
    numpy orders them (last, equal to each other)."""
    order = np.argsort(np.concatenate((values, points)), kind="stable")  # values first: ties count
    return np.flatnonzero(order >= values.size) - np.arange(points.size)


def read_only(values: np.ndarray) -> np.ndarray:
    """`values`, no longer writeable: for arrays computed once per table and shared by every analysis."""
    values.flags.writeable = False
    return values


def median(values: np.ndarray) -> float:
    """`np.median` of a 1-d array (NaN when it holds a NaN, or is empty), without importing numpy.ma,
    which np.median does on first use (see `distinct`). The same arithmetic: a partition, then the middle
    value or the mean of the two middle values, in the array's own precision."""
    values = np.asarray(values).ravel()
    n = values.size
    if n == 0 or (values.dtype.kind == "f" and np.isnan(values).any()):
        return float("nan")
    middle = n // 2
    if n % 2:
        return float(np.partition(values, middle)[middle])
    part = np.partition(values, (middle - 1, middle))
    return float(np.mean(part[middle - 1 : middle + 1]))


def nanmedian(values: np.ndarray) -> float:
    """`np.nanmedian` of a 1-d array: the median of its non-NaN values (NaN when there are none)."""
    values = np.asarray(values).ravel()
    return median(values[~np.isnan(values)])
