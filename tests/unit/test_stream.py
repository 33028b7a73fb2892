"""The streaming walk (trace/stream.py): the same tables as parsing the whole text, at any batch size,
on real traces and on layouts built to trip a boundary search; anything it cannot follow falls back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from helpers.real_traces import TraceSet
from torchscope.trace import parse as parse_module
from torchscope.trace.parse import parse_trace, parse_trace_bytes
from torchscope.trace.read import gunzip, iter_trace_chunks, max_trace_bytes, read_trace_bytes
from torchscope.trace.stream import EventStream, NotStreamable, Span, bracketed
from torchscope.trace.tables import STRING_COLUMNS, TraceFile


def _comparable(trace: TraceFile) -> dict[str, Any]:
    """Columns with string ids replaced by their text (ids depend on the order strings are met)."""
    strings = np.array(trace.events.strings, dtype=object)
    columns = {
        name: (strings[values] if name in STRING_COLUMNS else values)
        for name, values in trace.events.columns.items()
    }
    return {"columns": columns, "header": trace.header, "warnings": trace.warnings}


def _id_pattern(ids: np.ndarray) -> np.ndarray:
    """String ids renumbered by first appearance: equal when two tables tell the same values apart
    (pid 1 and pid "1" have the same text but are different ids)."""
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse]


def _assert_same(a: TraceFile, b: TraceFile) -> None:
    ca, cb = _comparable(a), _comparable(b)
    assert ca["header"] == cb["header"]
    assert ca["warnings"] == cb["warnings"]
    assert ca["columns"].keys() == cb["columns"].keys()
    for name in ca["columns"]:
        assert np.array_equal(ca["columns"][name], cb["columns"][name], equal_nan=name not in STRING_COLUMNS), name
    for name in STRING_COLUMNS:
        assert np.array_equal(_id_pattern(a.events.columns[name]), _id_pattern(b.events.columns[name])), name


def _whole(data: bytes) -> TraceFile:
    return parse_module._parse_whole(data, "<bytes>")


def _streamed_only(data: bytes, batch_bytes: int) -> TraceFile:
    """Parse through the stream, failing (instead of falling back) if the walk gives up."""
    chunks = (data[i : i + batch_bytes] for i in range(0, len(data), batch_bytes))
    return parse_module._parse_stream(chunks, "<bytes>", len(data), batch_bytes)


def test_real_traces_stream_to_the_same_tables(real_traces: TraceSet) -> None:
    files = real_traces.files()
    assert files
    for path in files:
        data = read_trace_bytes(path)
        whole = _whole(data)
        _assert_same(parse_trace(path), whole)  # file chunks (gzip inflated as it goes)
        _assert_same(_streamed_only(data, 4096), whole)  # many small batches: many cuts


def _event(i: int, **extra: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
            "args": {"External id": i}, **extra}


def _tricky_document() -> dict[str, Any]:
    events = [_event(i) for i in range(200)]
    # Boundary look-alikes inside strings and inside nested args: a cut there must be rejected.
    events[7]["name"] = 'weird}, {"name": "x'
    events[50]["args"]["Call stack"] = "a.py(1): f}, {" * 300
    events[90]["args"]["nested"] = [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}] * 50
    events[120]["name"] = "x" * 20_000  # one event larger than a batch
    events.append({"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}})
    return {
        "schemaVersion": 1,
        "note": 'a header string naming "traceEvents": [ and }, { before the real key',
        "deviceProperties": [{"id": 0, "name": "GPU"}, {"id": 1, "name": "GPU"}],
        "traceEvents": events,
        "traceName": "t.json",
        "baseTimeNanoseconds": 1700000000000000000,
    }


@pytest.mark.parametrize("batch_bytes", [64, 1000, 4096, 1 << 20])
@pytest.mark.parametrize("indent", [None, 1])
def test_boundary_look_alikes_are_never_cut(batch_bytes: int, indent: int | None) -> None:
    data = json.dumps(_tricky_document(), indent=indent).encode()
    streamed = _streamed_only(data, batch_bytes)
    _assert_same(streamed, _whole(data))
    assert len(streamed.events) == 201
    assert streamed.header["traceName"] == "t.json"  # a key after the events array
    assert streamed.header["deviceProperties"][1]["id"] == 1  # a key before it
    assert streamed.events.text(streamed.events.name[7]) == 'weird}, {"name": "x'


@pytest.mark.parametrize("batch_bytes", [64, 4096])
def test_bare_array_and_empty_header(batch_bytes: int) -> None:
    events = [_event(i) for i in range(100)]
    for doc in (events, {"traceEvents": events}):
        data = json.dumps(doc).encode()
        _assert_same(_streamed_only(data, batch_bytes), _whole(data))


def test_malformed_events_are_dropped_the_same_way() -> None:
    doc = _tricky_document()
    doc["traceEvents"][30]["ts"] = "not a number"
    doc["traceEvents"][31] = 5  # not an object
    doc["traceEvents"][32]["args"] = {"External id": "12"}  # coerced
    data = json.dumps(doc).encode()
    streamed = _streamed_only(data, 2048)
    _assert_same(streamed, _whole(data))
    assert any("dropped 2 malformed" in w for w in streamed.warnings)
    assert 12 in streamed.events.external_id.tolist()


def test_non_standard_literals_fall_back_to_the_whole_text() -> None:
    doc = _tricky_document()
    data = json.dumps(doc).encode().replace(b'"dur": 5.0', b'"dur": NaN', 40)
    with pytest.raises(NotStreamable):
        _streamed_only(data, 2048)
    trace = parse_trace_bytes(data, batch_bytes=2048)
    assert any("NaN" in w for w in trace.warnings)
    assert len(trace.events) == 201


def test_a_false_cut_is_rejected_by_decoding() -> None:
    seen: list[bytes] = []

    def decode(buffer: bytes, span: Span | None) -> list[Any] | None:
        text = bracketed(buffer, span)
        seen.append(text)
        try:
            return msgspec.json.decode(text)
        except msgspec.DecodeError:
            return None

    more = b"".join(b', {"name": "%d"}' % i for i in range(20))
    tricky = "b}, {" + "c" * 60
    text = b'{"traceEvents": [{"name": "a"}, {"name": "%s"}' % tricky.encode() + more + b'], "x": 1}'
    stream = EventStream([text[i : i + 20] for i in range(0, len(text), 20)], decode, batch_bytes=40)
    names = [e["name"] for batch in stream.batches() for e in batch]
    assert names == ["a", tricky, *map(str, range(20))]
    assert stream.header == {"x": msgspec.Raw(b"1")}
    assert any(t.endswith(b'{"name": "b}]') for t in seen)  # the false candidate was tried and rejected


def test_gzip_is_inflated_chunk_by_chunk(tmp_path: Path) -> None:
    text = json.dumps(_tricky_document()).encode()
    path = tmp_path / "two-members.json.gz"
    path.write_bytes(gzip.compress(text[:5000]) + gzip.compress(text[5000:]) + b"\0\0")
    chunks = list(iter_trace_chunks(path, chunk_bytes=1024))
    assert len(chunks) > 10 and max(map(len, chunks)) <= 1024
    assert b"".join(chunks) == gunzip(path.read_bytes(), path, max_trace_bytes()) == text
    _assert_same(parse_trace(path), _whole(text))


def _doc(events: list[Any], **keys: Any) -> bytes:
    return json.dumps({"traceEvents": events, **keys}).encode()


@pytest.mark.parametrize("batch_bytes", [16, 40, 4096])
def test_a_repeated_events_key_keeps_the_last_array_as_json_does(batch_bytes: int) -> None:
    first = json.dumps([_event(i) for i in range(30)])
    data = ('{"traceEvents": %s, "traceEvents": [%s]}' % (first, json.dumps(_event(99)))).encode()
    trace = parse_trace_bytes(data, batch_bytes=batch_bytes)
    _assert_same(trace, _whole(data))
    assert trace.events.ts_us.tolist() == [990.0]


@pytest.mark.parametrize("bad", [b"[, ", b"[\x0c"])
def test_json_errors_between_events_are_errors_at_any_batch_size(bad: bytes) -> None:
    from torchscope.errors import TraceFormatError

    good = _doc([_event(i) for i in range(40)])
    broken = [good.replace(b"[", bad, 1), good.replace(b"}, {", b"}\x0c, {", 1), good.replace(b"}, {", b"} {", 1)]
    for data in broken:
        for batch_bytes in (4, 64, 4096):
            with pytest.raises(TraceFormatError, match="malformed JSON"):
                parse_trace_bytes(data, batch_bytes=batch_bytes)


def test_flow_ids_do_not_depend_on_their_neighbours() -> None:
    flows = [{"ph": "s", "cat": "ac2g", "name": "f", "pid": 1, "tid": 1, "ts": 1.0, "id": value}
             for value in ("012", 7, "0x10", "abc", "9223372036854775808", 2**70)]
    data = _doc(flows + [_event(i) for i in range(40)] + flows[:2])
    whole = _whole(data)
    for batch_bytes in (64, 300, 4096):
        _assert_same(parse_trace_bytes(data, batch_bytes=batch_bytes), whole)
    ids = whole.events.flow_id.tolist()
    assert ids[1:3] == [7, 16] and ids[4:6] == [-1, -1]  # out of int64: absent, not a crash
    assert ids[0] == ids[-2] != 12  # "012" is not a number in JSON's sense: digested, and stably so


def test_objects_after_the_events_array_do_not_stop_streaming() -> None:
    samples = [{"cpu": i, "ts": i} for i in range(3000)]  # Chrome's `samples`: `}, {` after the events
    data = _doc([_event(i) for i in range(300)], samples=samples, traceName="a}, {b")
    for batch_bytes in (997, 4096, 1 << 16):
        streamed = _streamed_only(data, batch_bytes)  # no fallback to the whole text
        _assert_same(streamed, _whole(data))
        assert len(streamed.events) == 300 and len(streamed.header["samples"]) == 3000


def test_an_event_with_a_bad_arg_keeps_its_shapes_text() -> None:
    events = [_event(i) for i in range(20)]
    for event in events:
        event["args"]["Input Dims"] = [[1, 2], []]
    events[5]["args"]["External id"] = "not a number"  # this event takes the lenient path
    events[6]["args"]["External id"] = "17"  # coerced
    trace = parse_trace_bytes(_doc(events))
    dims = trace.events.input_dims
    assert len(set(dims.tolist())) == 1 and trace.events.text(dims[0]) == "[[1, 2], []]"
    assert trace.events.external_id[5] == -1 and trace.events.external_id[6] == 17
