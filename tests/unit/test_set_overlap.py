"""`set_overlap.overlap_of_each` (the distributed culprits' per-phase overlap) gives
`intervals.overlap_per_window_of_each`'s figures to the bit, on windows inside one interval, straddling
several, before every interval, empty or reversed."""

from __future__ import annotations

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.set_overlap import overlap_of_each


def test_overlap_of_each_is_the_per_set_overlap_to_the_bit() -> None:
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
        got = overlap_of_each(parts, ws, we)
        assert got.shape == (len(parts), ws.size)
        for part, row in zip(parts, got):
            assert np.array_equal(row, intervals.overlap_per_window(part, ws, we))


def test_no_sets_or_no_windows() -> None:
    assert overlap_of_each([], np.array([1.0]), np.array([2.0])).shape == (0, 1)
    one = (np.array([0.0]), np.array([10.0]))
    assert overlap_of_each([one], np.zeros(0), np.zeros(0)).shape == (1, 0)
    assert overlap_of_each([intervals.EMPTY, one], np.array([5.0, -3.0]), np.array([20.0, -1.0])).tolist() == [[0.0, 0.0], [5.0, 0.0]]
