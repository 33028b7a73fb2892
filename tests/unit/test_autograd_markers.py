"""The what-if optimizer cause merges the closures with the already merged forward/backward markers
(`autograd_markers.autograd_marker_set`): the same set, to the bit, as merging all their intervals at once."""

import numpy as np

from torchscope.analysis import intervals


def test_merging_a_merged_set_with_more_intervals_is_merging_them_all() -> None:
    rng = np.random.default_rng(11)
    for n, m in ((0, 0), (0, 5), (5, 0), (1, 1), (200, 3), (3000, 40), (50, 50)):
        start = np.round(rng.random(n + m) * 1e5, 3) + 1.7e12  # large starts, as trace times are
        dur = np.where(rng.random(n + m) < 0.1, 0.0, rng.random(n + m) * rng.choice([1e-3, 10.0, 2e3], n + m))
        start[rng.random(n + m) < 0.2] = start[0] if n + m else 0.0  # ties
        marked, closures = slice(0, n), slice(n, n + m)
        merged = intervals.union(start[marked], start[marked] + dur[marked])
        end = start + dur
        at_once = intervals.union(start, end)
        in_two = intervals.union(np.concatenate((merged[0], start[closures])), np.concatenate((merged[1], end[closures])))
        assert np.array_equal(at_once[0], in_two[0]) and np.array_equal(at_once[1], in_two[1])
