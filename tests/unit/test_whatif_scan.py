"""The replays read only each stream's carry from a segment's scan (`with_ends=False`): it must be the
same floats as the carry taken from every op's end."""

import numpy as np

from torchscope.analysis.whatif import _queue_scan, _scan_segment


def test_carry_without_ends_is_bit_identical() -> None:
    rng = np.random.default_rng(3)
    for n, streams, segments, rows in ((1, 1, 1, 1), (50, 3, 4, 5), (2000, 6, 9, 11), (500, 40, 2, 3)):
        segment = np.sort(rng.integers(0, segments, n))
        stream = rng.integers(0, streams, n)
        order = np.lexsort((np.arange(n), stream, segment))
        segment, stream = segment[order], stream[order]
        dur = rng.random(n) * rng.choice([1e-3, 1.0, 1e4], n)
        bounds = np.searchsorted(segment, np.arange(segments + 1), side="left")
        plan = _queue_scan(dur, stream, bounds)
        ready = np.sort(rng.random((rows, n)) * 1e6 + 1e9, axis=1)
        full, lean = np.full((rows, streams), -np.inf), np.full((rows, streams), -np.inf)
        for j in range(segments):
            part = slice(int(bounds[j]), int(bounds[j + 1]))
            ends = _scan_segment(plan, j, ready[:, part].copy(), full)
            _scan_segment(plan, j, ready[:, part].copy(), lean, with_ends=False)
            assert np.array_equal(full, lean)
            if ends.size:  # the carry is each stream's last end, as the full ends give it
                for s in np.unique(stream[part]).tolist():
                    assert np.array_equal(full[:, s], np.maximum.reduce(ends[:, stream[part] == s], axis=1))
