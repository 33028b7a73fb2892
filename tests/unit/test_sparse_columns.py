"""Sparse columns (the collectives' args): indexing like a dense array, and the same table from the compiled
scanner, the msgspec path, appended byte-range parts and the table cache."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from torchscope.trace import cache, fastscan
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.parse import Batch, batch_decoder, parse_trace
from torchscope.trace.sparse import SparseColumn
from torchscope.trace.stream import EventStream
from torchscope.trace.tables import SPARSE_COLUMNS, EventTable

_COMM_ARGS = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": 8, "In msg nelems": 1024,
              "Out msg nelems": 1024, "dtype": "Float", "Seq": 0}
_KEYS = {"comm_name": "Collective name", "pg_name": "Process Group Name", "group_size": "Group size",
         "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems", "comm_dtype": "dtype", "seq": "Seq"}
_MEMORY_KEYS = {"mem_bytes": "Bytes", "total_allocated": "Total Allocated", "total_reserved": "Total Reserved",
                "device_type": "Device Type", "device_id": "Device Id", "addr": "Addr"}


def test_indexing_matches_the_dense_column() -> None:
    rng = np.random.default_rng(0)
    dense = np.full(1000, -1, np.int64)
    carried = np.sort(rng.choice(1000, 37, replace=False))
    dense[carried] = rng.integers(0, 50, carried.size)
    column = SparseColumn.from_dense(dense, -1)
    assert column.rows.size == np.count_nonzero(dense != -1) and len(column) == 1000
    index = rng.integers(-1000, 1000, 300)
    mask = rng.random(1000) < 0.3
    assert np.array_equal(column[index], dense[index])
    assert np.array_equal(column[mask], dense[mask])
    assert np.array_equal(column[carried], dense[carried])
    for part in (slice(None), slice(10, 500), slice(990, 2000), slice(5, 800, 7), slice(500, 10)):
        assert np.array_equal(column[part], dense[part]), part
    assert column[int(carried[3])] == dense[carried[3]] and column[-1] == dense[-1] and column[1] == dense[1]
    assert np.array_equal(column >= 0, dense >= 0) and np.array_equal(np.asarray(column), dense)
    assert np.array_equal(np.maximum(column, 3), np.maximum(dense, 3)) and column.tolist() == dense.tolist()
    assert np.array_equal(column.select(mask).dense(), dense[mask])
    assert column.max() == dense.max() and column.sum() == dense.sum() and column.argmax() == dense.argmax()
    assert copy.deepcopy(column).rows.tolist() == column.rows.tolist()  # still sparse
    with pytest.raises(IndexError):
        column[np.array([1000])]
    empty = SparseColumn(5, np.zeros(0, np.int64), np.zeros(0, np.int32), 0)
    assert empty[np.array([0, 4])].tolist() == [0, 0] and empty[2:4].tolist() == [0, 0]


def _trace(path: Path) -> Path:
    """Ops and kernels, a few of them collectives (with and without each arg); the args also on events of
    other kinds, which never carry them into the table."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 10_000}]
    for i in range(400):
        ts = 10 + 20 * i
        if i % 50 == 7:
            args = {**_COMM_ARGS, "Seq": i, "In msg nelems": 10 * i}
            if i % 100 == 7:
                del args["dtype"], args["Group size"]
            events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts, "dur": 5, "args": args})
            events.append({"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 7, "ts": ts + 2, "dur": 9,
                           "args": {**args, "stream": 7, "correlation": i}})
        elif i % 10 == 3:  # memory events, some without an address (PyTorch < 1.10), some on the host
            args = {"Device Type": 1 - i % 20 // 10, "Device Id": -1 if i % 20 >= 10 else 0, "Bytes": 512 * i,
                    "Total Allocated": 1000 + i, "Total Reserved": 4096, "Addr": 7000 + i}
            if i % 30 == 3:
                del args["Addr"]
            events.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "args": args})
        elif i % 50 == 8:  # a runtime event is not of the collectives' kinds (nor of the memory ones)
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 3,
                           "args": {**_COMM_ARGS, "Bytes": 4, "Addr": 1, "correlation": i}})
        else:
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": ts, "dur": 5,
                           "args": {"External id": i, "Input Dims": [[4], [4]]}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def _expected(table: EventTable, path: Path) -> dict[str, list[object]]:
    """Each sparse column as the events give it: the arg where a collective's kind carries it."""
    events = json.loads(path.read_text())["traceEvents"]
    by_ts = {e["ts"]: e for e in events}
    out: dict[str, list[object]] = {name: [] for name in (*_KEYS, *_MEMORY_KEYS)}
    for ts in table.ts_us.tolist():
        event = by_ts[ts]
        args = event.get("args", {}) if event["cat"] in ("cpu_op", "kernel") else {}
        for name, key in _KEYS.items():
            default = "" if name in ("comm_name", "pg_name", "comm_dtype") else -1
            out[name].append(args.get(key, default))
        args = event.get("args", {}) if event["name"] == "[memory]" else {}
        for name, key in _MEMORY_KEYS.items():
            out[name].append(args.get(key, 0 if name == "mem_bytes" else -1))
    return out


def _columns(table: EventTable) -> dict[str, list[object]]:
    strings = ("comm_name", "pg_name", "comm_dtype")
    return {name: table.text(table.columns[name][:]) if name in strings else table.columns[name][:].tolist() for name in (*_KEYS, *_MEMORY_KEYS)}


def _same(a: EventTable, b: EventTable) -> None:
    assert a.strings == b.strings
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        assert type(a.columns[name]) is type(b.columns[name]), name
        assert a.columns[name].tobytes() == b.columns[name].tobytes(), name
        if isinstance(a.columns[name], SparseColumn):
            assert np.array_equal(a.columns[name].rows, b.columns[name].rows), name


def test_every_path_gives_the_same_sparse_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _trace(tmp_path / "comm.pt.trace.json")
    table = parse_trace(path).events
    assert set(SPARSE_COLUMNS) == {*_KEYS, *_MEMORY_KEYS} and all(isinstance(table.columns[n], SparseColumn) for n in SPARSE_COLUMNS)
    assert table.columns["seq"].rows.size == 16  # 8 collectives, on their op and their kernel: nothing else
    assert table.columns["comm_dtype"].rows.size == 8  # half of them without a dtype
    assert table.columns["mem_bytes"].rows.size == 40 and table.columns["addr"].rows.size == 26  # 14 without
    assert table.columns["total_allocated"].rows is table.columns["mem_bytes"].rows  # one row array
    assert _columns(table) == _expected(table, path)

    monkeypatch.setenv(fastscan.DISABLE_ENV, "1")
    _same(parse_trace(path).events, table)
    monkeypatch.delenv(fastscan.DISABLE_ENV)

    # byte ranges: two parts appended, as ranges.parse_ranges hands them over
    data = path.read_bytes()
    first = ColumnBuilder(None)
    batches: list[Batch] = list(EventStream(iter([data]), batch_decoder(first), 4096).batches())
    for batch in batches[: len(batches) // 2]:
        first.add_batch(batch, 0)
    joined = ColumnBuilder(len(data))
    joined.append(*first.parts(), len(data) // 2)
    second = ColumnBuilder(None)
    for batch in list(EventStream(iter([data]), batch_decoder(second), 4096).batches())[len(batches) // 2 :]:
        second.add_batch(batch, 0)
    joined.append(*second.parts(), len(data))
    parts = joined.finish([])[0]
    np.nan_to_num(parts.dur_us, copy=False)  # instants have no `dur`: parse_trace makes it 0 after the join
    _same(parts, table)

    # the table cache
    key = cache.cache_key(path)
    trace = parse_trace(path)
    assert cache.store(path, key, trace) is not None
    loaded = cache.load_cached(path, key)
    assert loaded is not None
    _same(loaded.events, table)
