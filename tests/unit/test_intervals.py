"""Interval arithmetic, checked against a brute-force reference on a fine integer grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from torchscope.analysis import intervals

interval_lists = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15)), max_size=12)


def _grid(pairs: list[tuple[int, int]]) -> np.ndarray:
    covered = np.zeros(100, dtype=bool)
    for start, length in pairs:
        covered[start : start + length] = True
    return covered


def _as_set(pairs: list[tuple[int, int]]) -> intervals.IntervalSet:
    starts = np.array([p[0] for p in pairs], dtype=float)
    return intervals.union(starts, starts + np.array([p[1] for p in pairs], dtype=float))


@settings(max_examples=200, deadline=None)
@given(interval_lists)
def test_union_is_disjoint_and_covers_the_same_points(pairs: list[tuple[int, int]]) -> None:
    starts, ends = _as_set(pairs)
    assert np.all(starts[1:] > ends[:-1])
    assert intervals.total_length((starts, ends)) == _grid(pairs).sum()


@settings(max_examples=200, deadline=None)
@given(interval_lists, interval_lists)
def test_intersect_and_subtract_match_set_semantics(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    sa, sb = _as_set(a), _as_set(b)
    for result, expected in ((intervals.intersect(sa, sb), _grid(a) & _grid(b)),
                             (intervals.subtract(sa, sb), _grid(a) & ~_grid(b))):
        starts, ends = result
        # A canonical set (what `union` gives): positive lengths, pieces that touch merged...
        assert np.all(ends > starts) and np.all(starts[1:] > ends[:-1])
        # ...covering exactly the expected grid cells.
        assert np.array_equal(_grid([(int(s), int(e - s)) for s, e in zip(starts, ends)]), expected)


@settings(max_examples=200, deadline=None)
@given(interval_lists, st.integers(0, 90), st.integers(0, 30))
def test_overlap_per_window(pairs: list[tuple[int, int]], start: int, length: int) -> None:
    got = intervals.overlap_per_window(_as_set(pairs), np.array([start]), np.array([start + length]))
    assert got[0] == _grid(pairs)[start : start + length].sum()


@settings(max_examples=100, deadline=None)
@given(st.lists(interval_lists, min_size=1, max_size=4))
def test_priority_partition_adds_up_and_respects_order(categories: list[list[tuple[int, int]]]) -> None:
    window = (np.array([0.0]), np.array([100.0]))
    parts = intervals.priority_partition([_as_set(c) for c in categories], window)
    assert sum(intervals.total_length(p) for p in parts) == 100
    taken = np.zeros(100, dtype=bool)
    for category, part in zip(categories, parts):
        expected = _grid(category) & ~taken
        assert intervals.total_length(part) == expected.sum()
        taken |= expected


def test_overlap_of_each_disjoint_set_is_the_per_set_overlap_to_the_bit() -> None:
    """On windows inside one interval, straddling several, before every interval, empty or reversed."""
    rng = np.random.default_rng(11)
    for _ in range(300):
        categories = []
        for _ in range(int(rng.integers(1, 6))):
            starts = np.round(rng.uniform(0, 1000, int(rng.integers(0, 40))), int(rng.integers(0, 3)))
            categories.append(intervals.union(starts, starts + np.round(rng.exponential(20, starts.size), 1)))
        window = (np.array([rng.uniform(0, 100)]), np.array([rng.uniform(900, 1000)]))
        parts = intervals.priority_partition(categories, window)  # mutually disjoint, some maybe empty
        ws = np.round(rng.uniform(-50, 1050, 300), int(rng.integers(0, 3)))
        # Short windows (mostly inside one interval), long ones, empty ones and a few reversed.
        we = ws + np.round(rng.exponential(rng.choice([3.0, 60.0]), ws.size), 1) * (rng.random(ws.size) > 0.1)
        we[rng.random(ws.size) < 0.05] -= 5.0
        got = intervals.overlap_per_window_of_each(parts, ws, we)
        assert got.shape == (len(parts), ws.size)
        for part, row in zip(parts, got):
            assert np.array_equal(row, intervals.overlap_per_window(part, ws, we))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(interval_lists, min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(-10, 110), st.integers(-3, 90)), min_size=1, max_size=30),
    st.sampled_from([1.0, 0.1, 1e-3]),
)
def test_overlap_of_each_equals_overlap_per_window_to_the_bit(
    categories: list[list[tuple[int, int]]], windows: list[tuple[int, int]], unit: float
) -> None:
    """Windows straddling several sets' intervals, starting before every interval, empty or reversed:
    each set's row is `overlap_per_window` of that set, bit for bit, at scales where sums round."""
    parts = intervals.priority_partition([_as_set(c) for c in categories], (np.array([0.0]), np.array([100.0])))
    parts = [(starts * unit, ends * unit) for starts, ends in parts]  # mutually disjoint, some maybe empty
    ws = np.array([w[0] for w in windows], dtype=float) * unit
    we = ws + np.array([w[1] for w in windows], dtype=float) * unit
    got = intervals.overlap_per_window_of_each(parts, ws, we)
    for part, row in zip(parts, got):
        assert row.tobytes() == intervals.overlap_per_window(part, ws, we).tobytes()


def test_overlap_of_each_with_no_sets_or_no_windows() -> None:
    assert intervals.overlap_per_window_of_each([], np.array([1.0]), np.array([2.0])).shape == (0, 1)
    one = (np.array([0.0]), np.array([10.0]))
    assert intervals.overlap_per_window_of_each([one], np.zeros(0), np.zeros(0)).shape == (1, 0)
    got = intervals.overlap_per_window_of_each([intervals.EMPTY, one], np.array([5.0, -3.0]), np.array([20.0, -1.0]))
    assert got.tolist() == [[0.0, 0.0], [5.0, 0.0]]


@settings(max_examples=300, deadline=None)
@given(st.lists(interval_lists, max_size=9), interval_lists, st.sampled_from([1.0, 0.25, 1e-3]))
def test_priority_partition_in_one_sweep_equals_one_category_at_a_time(
    categories: list[list[tuple[int, int]]], windows: list[tuple[int, int]], unit: float
) -> None:
    """The sweep returns exactly (bit for bit) what intersecting and subtracting one category at a time
    returns, for any number of categories, on fractional boundaries too."""
    def scaled(pairs: list[tuple[int, int]]) -> intervals.IntervalSet:
        starts, ends = _as_set(pairs)
        return starts * unit, ends * unit

    sets, win = [scaled(c) for c in categories], scaled(windows)
    swept = intervals.priority_partition(sets, win)
    stepwise = intervals._priority_partition_by_steps(sets, win)
    assert len(swept) == len(stepwise) == len(sets) + 1
    for (s0, s1), (t0, t1) in zip(swept, stepwise):
        assert s0.tobytes() == t0.tobytes() and s1.tobytes() == t1.tobytes()


@settings(max_examples=300, deadline=None)
@given(interval_lists, st.lists(st.tuples(st.integers(-5, 110), st.integers(-3, 20)), max_size=30), st.sampled_from([1.0, 0.1, 1e-3]))
def test_sparse_overlap_per_window_equals_overlap_per_window(
    pairs: list[tuple[int, int]], windows: list[tuple[int, int]], unit: float
) -> None:
    """Bit for bit, windows that miss the set (0.0), touch it, or have no length included."""
    starts, ends = _as_set(pairs)
    ws = np.array([w[0] for w in windows], dtype=float) * unit
    we = ws + np.array([w[1] for w in windows], dtype=float) * unit
    sparse = intervals.overlap_per_window_sparse((starts * unit, ends * unit), ws, we)
    dense = intervals.overlap_per_window((starts * unit, ends * unit), ws, we)
    assert sparse.tobytes() == dense.tobytes()
