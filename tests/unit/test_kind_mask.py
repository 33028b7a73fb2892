"""kind_mask (trace/kinds.py) is np.isin for one kind, a few and many."""

from __future__ import annotations

import numpy as np
import pytest

from torchscope.trace.kinds import Kind, kind_mask


@pytest.mark.parametrize("count", [0, 1, 2, 3, 8, 9, len(Kind)])
def test_kind_mask_is_isin(count: int) -> None:
    kinds = np.random.default_rng(count).integers(0, len(Kind), 2000).astype(np.int8)
    wanted = tuple(list(Kind)[1 : 1 + count])
    mask = kind_mask(kinds, wanted)
    assert mask.dtype == bool
    assert np.array_equal(mask, np.isin(kinds, [int(k) for k in wanted]))
    if count:
        assert np.array_equal(kind_mask(kinds, wanted[0]), kinds == int(wanted[0]))
