"""The compiled batch scanner (trace/_fastscan.c) against the msgspec path it stands in for.

Its contract: for any text, it either declines (None) or gives exactly the columns the msgspec path gives,
and it never accepts text msgspec rejects (a false cut in the stream must stay rejected). Checked on every
real trace, on generated events with every JSON type in every declared field, on tricky number
literals, and on randomly damaged batches. The real traces are ../shared's, or the ones committed under
tests/data/traces (tests/helpers/real_traces.py)."""

from __future__ import annotations

import functools
import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from helpers.real_traces import TraceSet
from torchscope.trace import fastscan
from torchscope.trace import parse as parse_module
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.parse import parse_trace
from torchscope.trace.read import read_trace_bytes
from torchscope.trace.stream import EventStream
from torchscope.trace.tables import STRING_COLUMNS, EventTable

pytestmark = pytest.mark.skipif(
    fastscan._fastscan is None, reason="torchscope.trace._fastscan was not built (no C compiler at install time)"
)
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------- helpers


def _via_scanner(text: bytes) -> EventTable | None:
    builder = ColumnBuilder(None)
    batch = fastscan.BatchScanner(builder.interner).scan(text)
    if batch is None:
        return None
    builder.add_scanned(batch, 0)
    return builder.finish([])[0]


def _via_msgspec(text: bytes) -> tuple[EventTable, int] | None:
    decoded = parse_module.decode_array(text)
    if decoded is None:
        return None
    builder = ColumnBuilder(None)
    builder.add(decoded[0], decoded[1], 0)
    return builder.finish([])


def _id_pattern(ids: np.ndarray) -> np.ndarray:
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first)] = np.arange(first.size)
    return rank[inverse]


def _assert_same_table(a: EventTable, b: EventTable) -> None:
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        x, y = a.columns[name], b.columns[name]
        assert x.dtype == y.dtype, name
        if name in STRING_COLUMNS:
            assert [a.strings[i] for i in x.tolist()] == [b.strings[i] for i in y.tolist()], name
            assert np.array_equal(_id_pattern(x), _id_pattern(y)), name  # pid 1 and "1" stay apart
        else:  # bit for bit: -0.0 and 0.0, NaN payloads, float32 rounding
            assert x.tobytes() == y.tobytes(), name


def _check(text: bytes) -> bool:
    """The contract on one text; True when the scanner accepted it."""
    scanned = _via_scanner(text)
    reference = _via_msgspec(text)
    if scanned is None:
        return False
    assert reference is not None, "the scanner accepted text msgspec rejects"
    table, dropped = reference
    assert dropped == 0
    _assert_same_table(scanned, table)
    return True


# ------------------------------------------------------------------------------------------- real traces


def test_same_tables_as_msgspec_on_every_real_trace(real_traces: TraceSet, monkeypatch: pytest.MonkeyPatch) -> None:
    accepted = 0
    for path in real_traces.files():
        monkeypatch.setenv(fastscan.DISABLE_ENV, "1")
        try:
            reference = parse_trace(path)
        except Exception as exc:  # not a loadable trace (a fixture of bad input): both paths must agree
            monkeypatch.delenv(fastscan.DISABLE_ENV)
            with pytest.raises(type(exc)):
                parse_trace(path)
            continue
        monkeypatch.delenv(fastscan.DISABLE_ENV)
        fast = parse_trace(path)
        _assert_same_table(fast.events, reference.events)
        assert fast.header == reference.header and fast.warnings == reference.warnings, path
        data = read_trace_bytes(path)
        start = data.find(b"[", data.find(b'"traceEvents"'))
        accepted += _check(b"[" + data[start + 1 : data.rfind(b"]")] + b"]") if start > 0 else 0
    assert accepted >= 5, "the scanner declined almost every real trace: it is not doing the work"


def test_the_scanner_takes_every_batch_of_a_real_resnet_trace(real_traces: TraceSet) -> None:
    path = real_traces.file("resnet50_num_workers_0")
    data = read_trace_bytes(path)
    scanner = fastscan.BatchScanner(ColumnBuilder(None).interner)
    chunks = [data[i : i + (256 << 10)] for i in range(0, len(data), 256 << 10)]
    stream = EventStream(iter(chunks), scanner.scan, 256 << 10)
    batches = list(stream.batches())
    assert batches and all(b is not None for b in batches)
    assert scanner.declined == 0 and scanner.scanned == len(batches) > 10


# ------------------------------------------------------------------------------------------- generated events


class Literal(str):
    """JSON text written as is (number literals json.dumps would never produce)."""


class Obj:
    """A JSON object as a member list, so that keys may repeat."""

    def __init__(self, members: list[tuple[str, Any]]) -> None:
        self.members = members

    def __repr__(self) -> str:
        return f"Obj({self.members!r})"


def _encode(value: Any, ascii_only: bool, space: str) -> str:
    if isinstance(value, Literal):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ("," + space).join(
            json.dumps(k, ensure_ascii=ascii_only) + space + ":" + space + _encode(v, ascii_only, space)
            for k, v in value.members
        ) + "}"
    if isinstance(value, list):
        return "[" + ("," + space).join(_encode(v, ascii_only, space) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


_INT_EDGES = [0, -1, 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32 - 1, 2**53, 2**53 + 1, 2**63 - 1,
              2**63, -(2**63), -(2**63) - 1, 10**18 - 1, 10**18, 10**19, 10**25]
_NUMBER_LITERALS = ["0", "-0", "0.0", "-0.0", "1e3", "1E+3", "2.5e-3", "0.1", "1e23", "9007199254740993",
                    "9007199254740993.0", "123456789012345678901234567890e-10", "2.2250738585072011e-308",
                    "1.7976931348623157e308", "4.9e-324", "1e400", "-1e400", "0.30000000000000004",
                    "5000082416.480", "1700000000123.4567", "00", "01", "1.", ".5", "-", "1e", "+1", "0x10"]
_CHARS = st.characters(codec="utf-8", exclude_categories=["Cs"])
# Short texts, and texts long enough for the scanner's 16- and 8-byte string loops (a special character at
# any position of a block).
_TEXT = st.text(_CHARS, max_size=12) | st.text(_CHARS, min_size=15, max_size=70) | st.sampled_from(
    ["", "X", "i", "f", "s", "M", "cpu_op", "kernel", "ac2g", "[memory]", "a\"b", "back\\slash", "tab\there",
     "\u00e9t\u00e9", "\U0001f600", "1", "0x1f", "ProfilerStep#3", "\x00", "\u2028",
     "\ud800", "\udc00x", "\ud800A", "\ud83d\ude00"])  # lone surrogates: json.dumps writes them as escapes
_SCALAR = (
    st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from(_INT_EDGES)
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(_NUMBER_LITERALS).map(Literal)
    | _TEXT | st.booleans() | st.none()
)
_VALUE = st.recursive(_SCALAR, lambda inner: st.lists(inner, max_size=3)
                      | st.lists(st.tuples(_TEXT, inner), max_size=3).map(Obj), max_leaves=6)
_TOP_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "s", "bp", "tts"]
_ARG_KEYS = [key for key, _, _ in fastscan.schema.ARG_FIELDS.values()] + ["Ev Idx", "Record function id", "cbid"]


def _typical(key: str) -> st.SearchStrategy[Any]:
    """Mostly the type Kineto writes for a key, sometimes anything."""
    if key in ("ph", "cat", "name", "Call stack"):
        return _TEXT
    if key in ("pid", "tid"):
        return st.integers(min_value=-(2**40), max_value=2**40) | _TEXT
    if key in ("ts", "dur", "memory bandwidth (GB/s)", "blocks per SM", "est. achieved occupancy %"):
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**60), 2**60) | (
            st.sampled_from(_NUMBER_LITERALS).map(Literal))
    if key in ("Input Dims", "Input type", "grid", "block"):
        return _VALUE
    return st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from(_INT_EDGES)


def _members(keys: list[str]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    key = st.sampled_from(keys) | _TEXT
    typical = key.flatmap(lambda k: st.tuples(st.just(k), _typical(k)))
    anything = st.tuples(key, _VALUE)
    # mostly well-typed members with distinct keys (what the scanner takes), sometimes anything at all
    return st.lists(typical, max_size=8, unique_by=lambda m: m[0]) | st.lists(typical | anything, max_size=8)


_ARGS = st.none() | _members(_ARG_KEYS).map(Obj) | _VALUE.filter(lambda v: not isinstance(v, Obj))
_EVENT = st.tuples(_members(_TOP_KEYS), _ARGS).map(
    lambda parts: Obj(parts[0] + ([] if parts[1] is None else [("args", parts[1])]))
)


@PROPERTY
@given(st.lists(_EVENT, max_size=6), st.booleans(), st.sampled_from(["", " ", "\n  ", "\t"]))
def test_generated_events_decode_as_msgspec_decodes_them(events: list[Any], ascii_only: bool, space: str) -> None:
    _check(("[" + space + ("," + space).join(_encode(e, ascii_only, space) for e in events) + "]").encode("utf-8",
                                                                                                        "surrogatepass"))


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(["ph", "cat", "name", "pid", "tid", "ts", "dur", "id"]), _SCALAR),
                min_size=1, max_size=8))
def test_well_typed_events_are_accepted(members: list[tuple[str, Any]]) -> None:
    """Kineto's own shapes must take the fast path (or the scanner would be dead weight)."""
    event = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 5.5, "dur": 1.25, "id": 7,
             "args": {"External id": 3, "Input Dims": [[2, 3]], "stream": 7, "bytes": 10, "grid": [1, 1, 1],
                      "est. achieved occupancy %": 50, "Total Allocated": 1 << 40, "name": "thread"}}
    assert _check(json.dumps([event]).encode())
    for key, value in members:  # then any scalar in a declared field: accepted or not, never different
        event[key] = value
    _check(json.dumps([event]).encode())


@pytest.mark.parametrize("literal", _NUMBER_LITERALS)
def test_number_literals_round_exactly(literal: str) -> None:
    text = f'[{{"ph": "X", "ts": {literal}, "dur": {literal}, "args": {{"blocks per SM": {literal}}}}}]'.encode()
    accepted = _check(text)
    if accepted:
        is_integer = literal.lstrip("-").isdigit()
        value = float(int(literal)) if is_integer else float(literal)  # as msgspec: an integer, then a float
        table = _via_scanner(text)
        assert table is not None
        assert struct.pack("<d", table.columns["ts_us"][0]) == struct.pack("<d", value)


def test_out_of_range_int32_arg_takes_the_default_as_the_lenient_path_does() -> None:
    text = b'[{"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": -1, "ts": 1, "dur": 9,' \
           b' "args": {"stream": 4294967295, "correlation": 225, "device": 0}}]'
    assert _check(text)
    table = _via_scanner(text)
    assert table is not None and table.columns["stream"][0] == -1 and table.columns["correlation"][0] == 225


# ------------------------------------------------------------------------------------------- damaged text


@functools.lru_cache(maxsize=1)
def _sample_batch(traces: TraceSet) -> bytes:
    path = traces.file("resnet50_num_workers_0")
    data = read_trace_bytes(path)
    start = data.find(b"[", data.find(b'"traceEvents"')) + 1
    end = start
    for _ in range(40):
        end = data.index(b"}, {", end + 1) if b"}, {" in data[end + 1 : end + 200_000] else end
    return b"[" + data[start : end + 1] + b"]"


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damaged_batches_are_declined_or_decoded_exactly(real_traces: TraceSet, data: st.DataObject) -> None:
    text = bytearray(_sample_batch(real_traces))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text) - 1))
        action = data.draw(st.sampled_from(["replace", "delete", "insert", "truncate"]))
        byte = data.draw(st.sampled_from(list(b'{}[],:"\\ 0123456789-.eE\x00\x1f\x80\xc3\xff') + [text[at] ^ 0x20]))
        if action == "replace":
            text[at] = byte
        elif action == "delete":
            del text[at]
        elif action == "insert":
            text.insert(at, byte)
        else:
            del text[at:]
        assume(len(text) > 0)
    _check(bytes(text))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_span_scans_exactly_as_its_bracketed_copy(real_traces: TraceSet, data: st.DataObject) -> None:
    """The stream hands the scanner the events between two offsets of its buffer (no copy): that must
    decode exactly as `[` + those bytes + `]` does (checked against msgspec by `_check`), reading nothing
    outside the span; spans at event boundaries and at arbitrary bytes alike."""
    text = _sample_batch(real_traces)
    separators = [m.start() for m in re.finditer(rb"\}\s*,\s*\{", text[: 1 << 16])]
    boundary = st.sampled_from([1, *(s + 1 for s in separators), *(s + 2 for s in separators)])
    start = data.draw(st.one_of(boundary, st.integers(0, len(text))))
    end = data.draw(st.one_of(boundary, st.integers(start, len(text))).filter(lambda e: e >= start))
    builder = ColumnBuilder(None)
    in_place = fastscan.BatchScanner(builder.interner).scan(text, (start, end))
    copied = b"[" + text[start:end] + b"]"
    accepted = _check(copied)
    assert (in_place is not None) == accepted, (start, end)
    if in_place is not None:
        builder.add_scanned(in_place, 0)
        _assert_same_table(builder.finish([])[0], _via_scanner(copied))  # type: ignore[arg-type]


def test_a_false_cut_is_never_accepted() -> None:
    """The stream confirms a cut by decoding `[` + piece + `]`: a piece cut inside a string or a nested
    object must be rejected by the scanner too."""
    event = b'{"ph": "X", "name": "a}, {b", "ts": 1, "args": {"Input Dims": [[1], {"x": {}}, {"y": 2}]}}'
    for cut in range(1, len(event)):
        piece = b"[" + event[:cut] + b"]"
        if parse_module.decode_array(piece) is None:
            assert _via_scanner(piece) is None, piece


@pytest.mark.parametrize("text", [
    rb'[{"ph":"X","foo":"\ud800"}]', rb'[{"ph":"X","foo":"\udc00x"}]', rb'[{"ph":"X","foo":"\ud800\u0041"}]',
    rb'[{"ph":"X","args":{"Input Dims":"\ud800"}}]', rb'[{"ph":"X","args":{"zzz":{"\ud800":1}}}]',
    rb'[{"ph":"X","name":"\ud800"}]', rb'[{"ph":"X","name":"\ud83d\ude00"}]',
])
def test_lone_surrogate_escapes_are_invalid_json_everywhere(text: bytes) -> None:
    """msgspec rejects a lone surrogate escape in any string (skipped values and raw fields included)."""
    _check(text)
    assert (_via_scanner(text) is None) == (parse_module.decode_array(text) is None)


@pytest.mark.parametrize("event", [
    b'{"ph":"X","cat":"cpu_op","name":"a","ts":1,"dur":2,"args":{"External id":-5}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2,"args":{"External id":-7,"external id":-5}}',
    b'{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2,"args":{"External id":-7}}',
    b'{"ph":"X","cat":"cuda_runtime","name":"r","ts":1,"dur":2,"args":{"external id":9}}',
])
def test_external_ids_combine_as_on_the_msgspec_path(event: bytes) -> None:
    """The larger of "External id" and the older "external id", with -1 for the older key on kinds that
    do not carry it: negative ids included, and in batches with or without such kinds."""
    assert _check(b"[" + event + b"]")
    assert _check(b"[" + event + b',{"ph":"X","cat":"cuda_runtime","name":"r","ts":3,"dur":1,"args":{"external id":-3}}]')


@pytest.mark.parametrize("extra", [b'"foo":1e400', b'"foo":-1e400', b'"foo":[1e400]', b'"foo":{"a":1e400}',
                                   b'"foo":123456789012345678901234567890', b'"foo":"x"', b'"foo":2.5'])
def test_the_lenient_default_only_where_the_lenient_path_keeps_the_event(extra: bytes) -> None:
    """An out-of-range int32 arg sends msgspec down its lenient path, which also decodes every top-level
    value and drops the event when one fails (1e400): the scanner must not keep what msgspec drops."""
    _check(b'[{"ph":"X","cat":"c","args":{"stream":4294967295},' + extra + b'}]')


def test_scanner_misuse_raises_instead_of_crashing() -> None:
    from torchscope.trace import _fastscan as native  # type: ignore[attr-defined]

    interner = ColumnBuilder(None).interner
    spec = [("ts", False, native.T_F8, 0.0, None), ("name", False, native.T_STR, 0.0, "")]
    with pytest.raises(RuntimeError):
        native.Scanner.__new__(native.Scanner).scan(b'[{"ts":1}]')  # never initialised
    scanner = native.Scanner(interner, spec)
    with pytest.raises(TypeError):
        scanner.scan(bytearray(b'[{"ts":1}]'))  # mutable: another thread could change it mid-scan
    assert scanner.scan(b'[{"ts":1,"name":"hello"}]') is not None
    text = b'[{"ts":1}]'
    with pytest.raises(TypeError):
        scanner.scan(text, 1)  # a start without an end
    for start, end in ((-1, 3), (3, 2), (0, len(text) + 1)):
        with pytest.raises(ValueError):
            scanner.scan(text, start, end)
    assert scanner.scan(text, 1, len(text) - 1)[0] == 1 and scanner.scan(text, 1, 1)[0] == 0
    with pytest.raises(ValueError):
        scanner.__init__(interner, [*spec, ("x", False, 99, 0.0, None)])  # a failed re-initialisation
    with pytest.raises(RuntimeError):
        scanner.scan(b'[{"ts":1}]')
    other = ColumnBuilder(None).interner
    scanner.__init__(other, spec)  # a new interner: ids from the old one must not be reused
    count, columns = scanner.scan(b'[{"ts":1,"name":"hello"}]')
    names = np.frombuffer(columns[1], np.int32)
    assert count == 1 and other.strings[int(names[0])] == "hello"


def test_reports_do_not_depend_on_the_parse_path_when_rows_tie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kernels with equal device time: the msgspec path met "A" first in its name column, the scanner
    met "B" first in the text. String ids are canonical (sorted text), so both give the same report."""
    import msgspec

    from torchscope import analyze
    from torchscope.report.model import encode_report

    events = []
    for step in range(3):
        t = step * 1000
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t, "dur": 900},
            {"ph": "X", "cat": "kernel", "name": "B", "pid": 0, "tid": 7, "ts": t + 10, "dur": 50, "args": {"stream": 7}},
            {"ph": "X", "cat": "A", "name": "other", "pid": 1, "tid": 1, "ts": t + 5, "dur": 1},
            {"ph": "X", "cat": "kernel", "name": "A", "pid": 0, "tid": 7, "ts": t + 100, "dur": 50, "args": {"stream": 7}},
        ]
    path = tmp_path / "tie.json"
    path.write_text(json.dumps({"traceEvents": events}))

    def report(scanner: bool) -> Any:
        monkeypatch.setenv(fastscan.DISABLE_ENV, "" if scanner else "1")
        return msgspec.json.decode(encode_report(analyze(path, jobs=1, use_cache=False)))

    fast, slow = report(True), report(False)
    assert [k["name"] for k in fast["kernels"]] == ["A", "B"]  # a tie: in text order
    fast.pop("generated_at", None), slow.pop("generated_at", None)
    assert fast == slow


def test_string_ids_are_canonical_and_only_for_strings_in_use(real_traces: TraceSet, monkeypatch: pytest.MonkeyPatch) -> None:
    path = real_traces.file("resnet50_num_workers_0")
    tables = []
    for flag in ("", "1"):
        monkeypatch.setenv(fastscan.DISABLE_ENV, flag)
        tables.append(parse_trace(path).events)
    fast, slow = tables
    assert fast.strings == slow.strings and fast.strings[0] == ""
    for name in STRING_COLUMNS:
        assert np.array_equal(fast.columns[name], slow.columns[name]), name
    used = np.unique(np.concatenate([fast.columns[name] for name in STRING_COLUMNS]))
    assert set(used.tolist()) | {0} == set(range(len(fast.strings)))  # no unused strings
