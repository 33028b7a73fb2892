"""EventTable.name_mask keeps a named predicate's answers per string: same masks, each name asked once."""

from __future__ import annotations

import numpy as np
import pytest

from torchscope.trace.tables import EventTable

_ASKED: list[str] = []


def _is_add(name: str) -> bool:
    _ASKED.append(name)
    return name.startswith("aten::add")


def _table() -> EventTable:
    strings = ["", "aten::add", "aten::mul", "aten::add_", "ProfilerStep#1", "unused shape"]
    name = np.array([1, 2, 3, 1, 4, 2, 3, 1], dtype=np.int32)
    return EventTable({"ts_us": np.arange(name.size, dtype=np.float64), "name": name}, strings)


def test_named_predicates_are_asked_once_per_name_and_give_the_same_masks() -> None:
    table = _table()
    expected = np.array([True, False, True, True, False, False, True, True])
    _ASKED.clear()
    rows = np.array([1, 2, 5])
    assert table.name_mask(_is_add, rows).tolist() == [False, True, False]
    assert sorted(_ASKED) == ["aten::add_", "aten::mul"]  # only the names of those rows
    assert table.name_mask(_is_add).tolist() == expected.tolist()
    assert sorted(_ASKED) == ["ProfilerStep#1", "aten::add", "aten::add_", "aten::mul"]  # the new ones only
    mask = table.name_mask(_is_add)
    mask[:] = False  # a caller may change its mask in place: the next one is fresh
    assert table.name_mask(_is_add).tolist() == expected.tolist()
    assert len(_ASKED) == 4 and "unused shape" not in _ASKED


def test_lambdas_and_closures_are_asked_every_time() -> None:
    table = _table()
    calls: list[str] = []

    def closure(name: str) -> bool:
        calls.append(name)
        return name == "aten::mul"

    for _ in range(2):
        assert table.name_mask(closure).tolist() == [False, True, False, False, False, True, False, False]
    assert len(calls) == 8  # 4 distinct names, twice
    assert table.name_mask(lambda s: s == "ProfilerStep#1").sum() == 1


def test_kind_masks_and_rows_are_kept_per_set_of_kinds() -> None:
    from torchscope.trace.kinds import DEVICE_KINDS, Kind, kind_mask

    kind = np.array([Kind.CPU_OP, Kind.KERNEL, Kind.MEMCPY, Kind.RUNTIME, Kind.KERNEL, Kind.FLOW], dtype=np.int8)
    table = EventTable({"ts_us": np.arange(kind.size, dtype=np.float64), "kind": kind}, [""])
    assert table.kind_mask(DEVICE_KINDS).tolist() == kind_mask(kind, DEVICE_KINDS).tolist()
    assert table.kind_rows(DEVICE_KINDS).tolist() == [1, 2, 4]
    assert table.kind_rows(Kind.KERNEL).tolist() == [1, 4]
    reordered = (Kind.MEMSET, Kind.KERNEL, Kind.MEMCPY)
    assert table.kind_rows(reordered) is table.kind_rows(DEVICE_KINDS)  # kept once asked again, in any order
    assert table.kind_mask(Kind.RUNTIME) is not table.kind_mask(Kind.RUNTIME)  # asked once: not kept
    assert table.kind_mask(Kind.RUNTIME) is table.kind_mask(Kind.RUNTIME)  # from the second ask on: kept
    with pytest.raises(ValueError):
        table.kind_mask(Kind.RUNTIME)[0] = True  # shared by every analysis: read-only


def test_thread_keys_and_rows() -> None:
    pid = np.array([1, 1, 2, 1, 2], dtype=np.int32)
    tid = np.array([3, 4, 3, 3, 3], dtype=np.int32)
    table = EventTable({"ts_us": np.zeros(5), "pid": pid, "tid": tid}, ["", "a", "b", "c", "d"])
    keys = table.thread_keys()
    assert keys.tolist() == [(1 << 32) | 3, (1 << 32) | 4, (2 << 32) | 3, (1 << 32) | 3, (2 << 32) | 3]
    assert table.thread_keys(np.array([4, 1])).tolist() == [keys[4], keys[1]]
    assert table.thread_rows(keys[0]).tolist() == [0, 3] and table.thread_rows(keys[2]).tolist() == [2, 4]
    assert table.thread_rows(int(keys[1])).tolist() == [1]


@pytest.mark.parametrize("matching", [0, 1, 3, 6, 7, 12])
def test_masks_are_the_same_whether_few_or_many_names_match(matching: int) -> None:
    from torchscope.trace import tables

    strings = ["", *(f"op{i}" for i in range(20))]
    name = np.random.default_rng(matching).integers(1, 16, 500).astype(np.int32)  # ops 16..19 unused
    table = EventTable({"ts_us": np.zeros(name.size), "name": name}, strings)
    wanted = {f"op{i}" for i in range(1, 1 + matching)}
    expected = np.array([strings[i] in wanted for i in name.tolist()])
    assert 1 <= tables._COMPARE_AT_MOST < 12  # both ways of building the mask are tried
    assert table.name_mask(lambda s: s in wanted).tolist() == expected.tolist()
    rows = np.arange(3, name.size, 7)
    assert table.name_mask(lambda s: s in wanted, rows).tolist() == expected[rows].tolist()
