"""The memory timeline's thinning (`memory._thin`) keeps the same points as the formulation it replaced
(np.maximum.reduceat over the np.array_split buckets, then the first position holding each maximum)."""

import numpy as np

from torchscope.analysis.memory import MAX_POINTS, _thin


def _thin_before(t: np.ndarray, values: np.ndarray) -> list[list[float]]:
    if t.size <= MAX_POINTS:
        return [[float(a), float(b)] for a, b in zip(t.tolist(), values.tolist())]
    q, r = divmod(t.size, MAX_POINTS)
    edges = np.r_[0, np.cumsum(np.r_[np.full(r, q + 1), np.full(MAX_POINTS - r, q)])].astype(np.int64)
    best = np.maximum.reduceat(values, edges[:-1])
    hits = np.flatnonzero(values == np.repeat(best, np.diff(edges)))
    bucket = np.searchsorted(edges, hits, side="right") - 1
    first = hits[np.r_[True, bucket[1:] != bucket[:-1]]]
    return [[float(a), float(b)] for a, b in zip(t[first].tolist(), values[first].tolist())]


def test_thin_matches_the_bucket_maxima_it_replaced() -> None:
    rng = np.random.default_rng(7)
    sizes = [0, 1, 5, MAX_POINTS - 1, MAX_POINTS, MAX_POINTS + 1, 2 * MAX_POINTS, 2 * MAX_POINTS + 399, 18496, 100_003]
    for n in sizes:
        t = np.cumsum(rng.random(n) * 10.0) + 1e9
        for values in (
            rng.integers(0, 2**40, n),  # distinct values
            rng.integers(0, 4, n) * 2**30,  # many ties within each bucket
            np.cumsum(rng.integers(-(2**20), 2**20, n)),  # a running total, as the allocated series
            np.full(n, 2**55 + 1, dtype=np.int64),  # above 2**53: rounded to a float the same way
        ):
            got = _thin(t, values)
            assert got == _thin_before(t, values), n
            assert len(got) == min(n, MAX_POINTS)
            assert all(type(x) is float for point in got for x in point)
