"""`host.encloses`: the events that have a descendant in a mask (climbing from the marked events only)
against a plain walk up each marked event's ancestors, on random forests."""

from __future__ import annotations

import numpy as np

from torchscope.analysis.host import encloses
from torchscope.analysis.nesting import HostTree


def _forest(rng: np.random.Generator, n: int) -> HostTree:
    parent = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    for i in range(1, n):
        if rng.random() < 0.8:  # else a root (or, below, a non-host event: depth -1)
            parent[i] = rng.integers(0, i)
            depth[i] = depth[parent[i]] + 1 if depth[parent[i]] >= 0 else 0
            if depth[parent[i]] < 0:
                parent[i] = -1
        elif rng.random() < 0.3:
            depth[i] = -1
    return HostTree(parent, depth)


def _ancestors_of_marked(tree: HostTree, mask: np.ndarray) -> np.ndarray:
    flag = np.zeros(mask.size, dtype=bool)
    for row in np.flatnonzero(mask):
        up = tree.parent[row]
        while up >= 0:
            flag[up] = True
            up = tree.parent[up]
    return flag


def test_encloses_is_the_set_of_strict_ancestors_of_the_marked_events() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 50, 400):
        tree = _forest(rng, n)
        for share in (0.0, 0.02, 0.3, 1.0):
            mask = rng.random(n) < share
            assert np.array_equal(encloses(tree, mask), _ancestors_of_marked(tree, mask))
