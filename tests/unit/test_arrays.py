"""torchscope.arrays: the numpy helpers give numpy's results, without importing numpy.ma."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from torchscope.arrays import count_at_or_below, distinct, group_ids, group_pairs, median, nanmedian

floats = st.lists(st.one_of(st.floats(-1e12, 1e12), st.just(float("nan"))), max_size=40)


def _same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a == b


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-5, 5), max_size=40))
def test_distinct_is_np_unique(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    assert np.array_equal(distinct(array), np.unique(array))


@settings(max_examples=300, deadline=None)
@given(floats, st.sampled_from([np.float64, np.float32]))
def test_median_and_nanmedian_are_numpys(values: list[float], dtype: type) -> None:
    array = np.array(values, dtype=dtype)  # float32: the mean of the two middle values stays float32
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = float(np.median(array)) if array.size else float("nan")
        expected_nan = float(np.nanmedian(array)) if (~np.isnan(array)).any() else float("nan")
    assert _same(median(array), expected)
    assert _same(nanmedian(array), expected_nan)


def test_helpers_do_not_import_numpy_ma() -> None:
    """np.unique and np.median import numpy.ma on first use (~10 ms of every run); these must not."""
    code = ("import sys, numpy as np\nfrom torchscope.arrays import distinct, median, nanmedian\n"
            "distinct(np.arange(5)); median(np.arange(4.0)); nanmedian(np.arange(3.0))\n"
            "assert 'numpy.ma' not in sys.modules, 'numpy.ma was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_group_ids_is_np_unique_with_inverse() -> None:
    rng = np.random.default_rng(3)
    cases = [rng.integers(0, 50, 1000).astype(np.int32), rng.integers(0, 10**6, 300).astype(np.int64),  # sparse ids: sorted
             np.array([7], np.int32), np.zeros(0, np.int32), np.array([-1, 3, -1, 2], np.int64),
             (rng.integers(0, 40, 500).astype(np.int64) << 32) | 5]
    for ids in cases:
        unique, inverse = group_ids(ids)
        expected_unique, expected_inverse = np.unique(ids, return_inverse=True)
        assert unique.dtype == expected_unique.dtype and inverse.dtype == expected_inverse.dtype
        assert np.array_equal(unique, expected_unique) and np.array_equal(inverse, expected_inverse)



def test_group_pairs_is_group_ids_of_the_64_bit_keys() -> None:
    rng = np.random.default_rng(5)
    cases = [(rng.integers(0, 60, 2000), rng.integers(0, 45, 2000)),  # dense ranks: a table for the pairs
             (rng.integers(0, 2**31 - 1, 300), rng.integers(0, 2**31 - 1, 300)),  # many distinct pairs: sorted
             (np.array([7]), np.array([0])), (np.zeros(0), np.zeros(0))]
    for high, low in cases:
        high, low = high.astype(np.int32), low.astype(np.int32)
        keys, group = group_pairs(high, low)
        expected_keys, expected_group = group_ids((high.astype(np.int64) << 32) | low.astype(np.int64))
        assert keys.dtype == np.int64 and np.array_equal(keys, expected_keys)
        assert np.array_equal(group.reshape(-1), expected_group.reshape(-1))

@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0, 1.5, 2.0, 7.0, float("nan"), -3.0]), max_size=40),
       st.lists(st.sampled_from([0.0, 1.0, 1.5, 2.0, 7.0, float("nan"), -3.0, 9.0]), max_size=40))
def test_count_at_or_below_is_searchsorted_of_the_sorted_values(values: list[float], points: list[float]) -> None:
    v, p = np.array(values, dtype=float), np.sort(np.array(points, dtype=float))
    assert count_at_or_below(v, p).tolist() == np.searchsorted(np.sort(v), p, side="right").tolist()
