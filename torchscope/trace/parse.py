"""Parse Kineto Chrome-trace JSON into an `EventTable`.

How: the text is read in chunks and its events array is cut into batches of a few MB at event
boundaries (`stream.EventStream`); each batch is decoded with msgspec into small typed structs
(`schema.Event`, with the args torchscope reads) and written into preallocated numpy columns, then
dropped. Peak memory is the columns plus one batch, whatever the file size: the JSON text is never held
whole. Strings are interned as they are seen. A batch whose events do not all fit the strict shape is
decoded event by event with type coercion; events that still do not fit are dropped and counted. Text
that the streaming walk cannot follow (non-standard NaN literals, UTF-16, damage) is parsed whole, which
also gives the precise error for a damaged file.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import re
from concurrent.futures.process import BrokenProcessPool
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec
import numpy as np

from torchscope.errors import TraceFormatError
from torchscope.trace import schema
from torchscope.trace.kinds import Kind, kind_mask, kind_of_event
from torchscope.trace import ranges
from torchscope.trace.read import GZIP_MAGIC, estimated_text_bytes, iter_trace_chunks, read_trace_bytes
from torchscope.trace.stream import BATCH_BYTES, EventStream, NotStreamable, locate_events
from torchscope.trace.tables import NUMERIC_COLUMNS, STRING_COLUMNS, EventTable, StringInterner, TraceFile

log = logging.getLogger(__name__)

BATCH_EVENTS = 100_000  # events per batch when a whole text is parsed (the fallback path)
_MAX_HEADER_VALUE_BYTES = 64 << 20

_BASE_STRING_SOURCES = ("ph", "cat", "name", "pid", "tid")
_RAW_TEXT_COLUMNS = frozenset(c for c, (_, kind, _) in schema.ARG_FIELDS.items() if kind is msgspec.Raw)
_Batch = tuple[list[schema.Event], int]  # decoded events, and how many malformed ones were dropped


BytesDone = Callable[[int], None]  # called with the bytes of text parsed since the last call


def _ignore_bytes(nbytes: int) -> None:
    return None


def parse_trace(path: Path, jobs: int = 1, on_bytes: BytesDone | None = None) -> TraceFile:
    """Read and parse one trace file, streaming it (the text is never held whole when it can be helped).

    With `jobs` > 1, a large uncompressed file is parsed in byte ranges on that many processes.
    `on_bytes`, if given, is told how much text has been parsed as the parse goes (for a progress bar)."""
    report = on_bytes or _ignore_bytes
    if jobs > 1 and _splittable(path):
        try:
            return _parse_parallel(path, jobs, report)
        except (NotStreamable, BrokenProcessPool) as reason:  # ranges that do not join up, a dead worker
            log.debug("%s: parsing sequentially (%r)", path, reason)
    try:
        return _parse_stream(iter_trace_chunks(path), path, estimated_text_bytes(path), on_bytes=report)
    except NotStreamable as reason:
        log.debug("%s: parsing the whole text (%s)", path, reason)
    return _parse_whole(read_trace_bytes(path), path)


def _splittable(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            plain = handle.read(2) != GZIP_MAGIC
        return plain and path.stat().st_size >= ranges.PARALLEL_MIN_BYTES
    except OSError:
        return False  # the sequential path reports the problem


def _parse_parallel(path: Path, jobs: int, on_bytes: BytesDone) -> TraceFile:
    """Parse a plain file in byte ranges on `jobs` processes (see `trace/ranges.py`)."""
    header_before, events_start, object_mode = locate_events(iter_trace_chunks(path))
    header = decode_header(header_before)
    size = path.stat().st_size
    builder = ColumnBuilder(size)
    consumed = 0
    for part in ranges.parse_ranges(path, events_start, object_mode, jobs):
        done = (part.next_start if part.next_start is not None else size) - events_start
        on_bytes(done - consumed)
        consumed = done
        builder.append(part.columns, part.keys, part.dropped, consumed)
        header.update(part.header)
    warnings: list[str] = []
    table, dropped = builder.finish(warnings)
    _check_events(table, path, dropped)
    _clean_times(table, warnings, path)
    return TraceFile(str(path), header, table, warnings)


def parse_trace_bytes(data: bytes, path: Path | str = "<bytes>", batch_bytes: int = BATCH_BYTES) -> TraceFile:
    """Parse Chrome-trace JSON (object with `traceEvents`, or a bare event array) held in memory.

    Goes through the same streaming walk as `parse_trace` (`batch_bytes` sets its batch size)."""
    if not data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            chunks = (data[i : i + batch_bytes] for i in range(0, len(data), batch_bytes))
            return _parse_stream(chunks, path, len(data), batch_bytes)
        except NotStreamable as reason:
            log.debug("%s: parsing the whole text (%s)", path, reason)
    return _parse_whole(data, path)


def _parse_stream(
    chunks: Iterable[bytes], path: Path | str, size_hint: int | None, batch_bytes: int = BATCH_BYTES,
    on_bytes: BytesDone = _ignore_bytes,
) -> TraceFile:
    stream: EventStream[_Batch] = EventStream(_without_utf8_bom(chunks), decode_array, batch_bytes)
    builder = ColumnBuilder(size_hint)
    reported = 0
    for events, dropped in stream.batches():
        builder.add(events, dropped, stream.consumed)
        on_bytes(stream.consumed - reported)
        reported = stream.consumed
    if builder.filled == 0 and builder.dropped == 0 and stream.consumed == 0:
        raise NotStreamable("empty")  # let the whole-text path name the problem
    warnings: list[str] = []
    table, dropped = builder.finish(warnings)
    header = decode_header(stream.header)
    _check_events(table, path, dropped)
    _clean_times(table, warnings, path)
    return TraceFile(str(path), header, table, warnings)


def _without_utf8_bom(chunks: Iterable[bytes]) -> Iterator[bytes]:
    first = True
    for chunk in chunks:
        if first and chunk.startswith(codecs.BOM_UTF8):
            chunk = chunk[len(codecs.BOM_UTF8) :]
        first = False
        yield chunk


def decode_array(text: bytes) -> _Batch | None:
    """A JSON array of events, decoded; None when `text` is not a JSON array (a false cut)."""
    try:
        return schema.EVENT_LIST_DECODER.decode(text), 0
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        raw = schema.RAW_LIST_DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return _decode_leniently(raw)


def _parse_whole(data: bytes, path: Path | str) -> TraceFile:
    """Parse a whole text at once: the fallback for text the streaming walk cannot follow."""
    data = _to_utf8(data, path)
    if not data or data.isspace():
        raise TraceFormatError(path, "empty file")
    warnings: list[str] = []
    top = _decode_top_level(data, path, warnings)
    header, raw_events = _split_top_level(top, path)
    del top
    builder = ColumnBuilder(None)
    for events, dropped in _event_batches(raw_events, path):
        builder.add(events, dropped, 0)
    del raw_events
    table, dropped = builder.finish(warnings)
    _check_events(table, path, dropped)
    _clean_times(table, warnings, path)
    return TraceFile(str(path), header, table, warnings)


def _to_utf8(data: bytes, path: Path | str) -> bytes:
    """Drop a UTF-8 byte-order mark; re-encode UTF-16 (with its BOM) as UTF-8."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16").encode("utf-8", "surrogatepass")
        except UnicodeError:
            raise TraceFormatError(path, "damaged UTF-16 text") from None
    return data


def _decode_top_level(data: bytes, path: Path | str, warnings: list[str]) -> Any:
    try:
        return schema.TOP_LEVEL_DECODER.decode(data)
    except msgspec.ValidationError as exc:  # valid JSON of the wrong shape (a subclass of DecodeError)
        raise TraceFormatError(path, _describe_validation_error(exc)) from None
    except msgspec.DecodeError as exc:
        if not _has_non_standard_literal(data, exc):
            raise TraceFormatError(path, _describe_decode_error(exc, data)) from None
    except RecursionError:
        raise TraceFormatError(path, "JSON nested too deeply") from None
    # NaN/Infinity (written by Python's json module, not JSON): read them as null (= absent) and go on.
    data, count = _NON_STANDARD_LITERAL.subn(rb"\1null", data)
    warnings.append(f"read {count} non-standard NaN/Infinity value(s) as missing")
    try:
        return schema.TOP_LEVEL_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise TraceFormatError(path, _describe_decode_error(exc, data)) from None


# A NaN/Infinity literal in value position (after `:`, `,` or `[`, before `,`, `]` or `}`).
_NON_STANDARD_LITERAL = re.compile(rb"([:,\[]\s*)(?:NaN|-?Infinity)(?=\s*[,\]}])")
_ERROR_OFFSET = re.compile(r"\(byte (\d+)\)")
_JSON_TYPE_NAMES = {"int": "number", "float": "number", "str": "string", "bool": "boolean"}


def _has_non_standard_literal(data: bytes, exc: Exception) -> bool:
    match = _ERROR_OFFSET.search(str(exc))
    if match is None:
        return False
    offset = int(match.group(1))
    return data[offset : offset + 9].startswith((b"NaN", b"Infinity", b"-Infinity"))


def _describe_validation_error(exc: Exception) -> str:
    text = str(exc)
    got = re.search(r"got `(\w+)`", text)
    if got:
        kind = _JSON_TYPE_NAMES.get(got.group(1), got.group(1))
        return f"not a Kineto trace: the top level is a JSON {kind}, not an object with 'traceEvents'"
    return f"invalid JSON value ({text})"


def _describe_decode_error(exc: Exception, data: bytes) -> str:
    text = str(exc)
    if "truncated" in text:
        return "truncated JSON (the file ends in the middle of the data)"
    if b"\0" in data[:4096]:
        return "not JSON text (binary data)"
    return f"malformed JSON ({text.removeprefix('JSON is malformed: ')})"


def _split_top_level(top: Any, path: Path | str) -> tuple[dict[str, Any], list[msgspec.Raw]]:
    if isinstance(top, list):
        return {}, top
    raw = top.pop("traceEvents", None)
    if raw is None:
        raise TraceFormatError(path, "not a Kineto trace: no 'traceEvents' array")
    try:
        events = schema.RAW_LIST_DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        raise TraceFormatError(path, "not a Kineto trace: 'traceEvents' is not an array") from None
    return decode_header(top), events


def decode_header(raw_header: dict[str, msgspec.Raw]) -> dict[str, Any]:
    header: dict[str, Any] = {}
    for key, value in raw_header.items():
        if len(value) > _MAX_HEADER_VALUE_BYTES:
            continue  # never let a foreign, giant header field dominate memory
        try:
            header[key] = msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError):
            continue
    return header


def _event_batches(raw_events: list[msgspec.Raw], path: Path | str) -> Iterator[_Batch]:
    """Decoded events in batches, with the number of malformed events dropped from each."""
    for start in range(0, len(raw_events), BATCH_EVENTS):
        batch = raw_events[start : start + BATCH_EVENTS]
        decoded = decode_array(b"[" + b",".join(batch) + b"]")
        yield decoded if decoded is not None else _decode_leniently(batch)


class ColumnBuilder:
    """Columns filled batch by batch, allocated once from an estimate of the event count.

    The estimate (events per byte so far times the text size) is refined as batches come; when it falls
    short the columns grow in place (`ndarray.resize`, a realloc, no second copy at the peak), and the
    unused tail is released at the end."""

    def __init__(self, size_hint: int | None) -> None:
        self.interner = StringInterner()
        self.kinds = _KindCache(self.interner)
        self.size_hint = size_hint
        self.columns: dict[str, np.ndarray] | None = None
        self.filled = 0
        self.dropped = 0

    def add(self, events: list[schema.Event], dropped: int, consumed_bytes: int) -> None:
        """Append decoded events (`consumed_bytes`: text read so far, for the size estimate)."""
        self.dropped += dropped
        columns = self._reserve(self.filled + len(events), consumed_bytes)
        _fill_columns(events, self.interner, self.kinds, columns, self.filled)
        self.filled += len(events)

    def append(self, part: dict[str, np.ndarray], keys: list[Any], dropped: int, consumed_bytes: int) -> None:
        """Append another builder's columns (`parts()`), mapping its string ids to this table's."""
        self.dropped += dropped
        count = len(part["ts_us"])
        columns = self._reserve(self.filled + count, consumed_bytes)
        # Keys, not their text: as in one process, pid 1 and pid "1" stay distinct ids.
        mapping = np.fromiter(map(self.interner.__getitem__, keys), np.int32, len(keys))
        rows = slice(self.filled, self.filled + count)
        for name, values in part.items():
            columns[name][rows] = mapping[values] if name in STRING_COLUMNS else values
        self.filled += count

    def _reserve(self, needed: int, consumed_bytes: int) -> dict[str, np.ndarray]:
        if self.columns is None:
            self.columns = _allocate(max(needed, self._estimate(needed, consumed_bytes)))
        elif needed > len(self.columns["ts_us"]):
            capacity = len(self.columns["ts_us"])
            _grow(self.columns, max(needed, self._estimate(needed, consumed_bytes), capacity + capacity // 4))
        return self.columns

    def parts(self) -> tuple[dict[str, np.ndarray], list[Any], int]:
        """The filled columns, the interned values in id order and the dropped count, to `append`
        elsewhere (the interner gives ids in insertion order)."""
        columns = self.columns if self.columns is not None else _allocate(0)
        for values in columns.values():
            values.resize(self.filled, refcheck=False)
        return columns, list(self.interner), self.dropped

    def _estimate(self, events: int, consumed_bytes: int) -> int:
        if not self.size_hint or not consumed_bytes:
            return events
        return int(events / consumed_bytes * self.size_hint * 1.02) + 64

    def finish(self, warnings: list[str]) -> tuple[EventTable, int]:
        columns = self.columns if self.columns is not None else _allocate(0)
        if self.filled < len(columns["ts_us"]):
            for values in columns.values():
                values.resize(self.filled, refcheck=False)  # in place: frees the unused tail
        if self.dropped:
            warnings.append(f"dropped {self.dropped} malformed event(s) of {self.filled + self.dropped}")
        return EventTable(columns, self.interner.strings), self.dropped


_DEFAULTS: dict[str, Any] = {
    **{name: -1 for name in NUMERIC_COLUMNS},
    **{name: default for name, (_, _, default) in schema.ARG_FIELDS.items() if name in NUMERIC_COLUMNS},
    **{name: 0 for name in STRING_COLUMNS},
    "kind": 0,
}
_DTYPES: dict[str, Any] = {**NUMERIC_COLUMNS, **{name: np.int32 for name in STRING_COLUMNS}, "kind": np.int8}


def _allocate(n: int) -> dict[str, np.ndarray]:
    """Empty columns holding each column's "absent" default."""
    return {name: np.full(n, _DEFAULTS[name], dtype) for name, dtype in _DTYPES.items()}


def _grow(columns: dict[str, np.ndarray], capacity: int) -> None:
    for name, values in columns.items():
        old = len(values)
        values.resize(capacity, refcheck=False)  # realloc in place; only column views are transient
        values[old:] = _DEFAULTS[name]


def _decode_leniently(raws: list[msgspec.Raw]) -> _Batch:
    events = [e for e in map(_decode_one_leniently, raws) if e is not None]
    return events, len(raws) - len(events)


def _decode_one_leniently(raw: msgspec.Raw) -> schema.Event | None:
    """Decode one event, coercing types (e.g. a numeric string); None when it cannot be used."""
    try:
        return schema.EVENT_DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        fields = schema.RAW_OBJECT_DECODER.decode(raw)
        args = fields.pop("args", None)
        obj = {key: msgspec.json.decode(value) for key, value in fields.items()}
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(obj.get("ph"), str):
        return None
    obj = {key: value for key, value in obj.items() if value is not None}  # null = absent: use the default
    try:
        event = msgspec.convert(obj, schema.Event, strict=False)
    except (msgspec.ValidationError, TypeError, RecursionError):
        return None
    if args is not None:
        event.args = _decode_args_leniently(args)
    return event


_LENIENT_ARGS_DECODER = msgspec.json.Decoder(schema.Args, strict=False)


def _decode_args_leniently(raw_args: msgspec.Raw) -> Any:
    """The args keys whose values can be used (coerced where needed); the others keep their defaults.

    Works on each value's own JSON text, so raw-text columns (shapes, grid, block) keep exactly the text
    their neighbours in the same trace have, and group with them."""
    try:
        items = schema.RAW_OBJECT_DECODER.decode(raw_args)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return schema.NO_ARGS  # not an object: no usable args
    usable = []
    for key, value in items.items():
        member = msgspec.json.encode(key) + b":" + bytes(value)
        try:
            _LENIENT_ARGS_DECODER.decode(b"{" + member + b"}")
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            continue
        usable.append(member)
    return _LENIENT_ARGS_DECODER.decode(b"{" + b",".join(usable) + b"}")


class _KindCache:
    """Kind per (category, phase, name is "[memory]"), computed once per distinct combination: a batch
    costs one `np.unique` over integer keys, never a pass over the string table."""

    def __init__(self, interner: StringInterner) -> None:
        self.interner = interner
        self.known: dict[int, int] = {}

    def kinds(self, cat: np.ndarray, ph: np.ndarray, name: np.ndarray) -> np.ndarray:
        memory_id = self.interner["[memory]"]
        key = (cat.astype(np.int64) << 32) | (ph.astype(np.int64) << 1) | (name == memory_id)
        unique, inverse = np.unique(key, return_inverse=True)
        strings = self.interner.strings
        lookup = np.empty(len(unique), np.int8)
        for i, combo in enumerate(unique.tolist()):
            kind = self.known.get(combo)
            if kind is None:
                category, phase = strings[combo >> 32], strings[(combo & 0xFFFFFFFF) >> 1]
                kind = self.known[combo] = int(kind_of_event(category, phase, bool(combo & 1)))
            lookup[i] = kind
        return lookup[inverse]


def _fill_columns(
    events: list[schema.Event], interner: StringInterner, kind_cache: _KindCache,
    columns: dict[str, np.ndarray], offset: int,
) -> None:
    """Write one batch of decoded events into rows [offset, offset + len(events)) of the columns."""
    n = len(events)
    rows = slice(offset, offset + n)
    lookup: Callable[[Any], int] = interner.__getitem__
    columns["ts_us"][rows] = np.fromiter(map(attrgetter("ts"), events), np.float64, n)
    columns["dur_us"][rows] = np.fromiter(map(attrgetter("dur"), events), np.float64, n)
    for column in _BASE_STRING_SOURCES:
        columns[column][rows] = np.fromiter(map(lookup, map(attrgetter(column), events)), np.int32, n)
    kind = kind_cache.kinds(columns["cat"][rows], columns["ph"][rows], columns["name"][rows])
    columns["kind"][rows] = kind
    flows = np.flatnonzero(kind == Kind.FLOW)  # only flow events carry an `id`
    if flows.size:
        ids = list(map(attrgetter("id"), itemgetter_list(events, flows)))
        flow_ids = None
        if set(map(type, ids)) == {int}:  # Kineto's integer ids: converted at C speed
            try:
                flow_ids = np.fromiter(ids, np.int64, flows.size)
            except OverflowError:
                pass
        if flow_ids is None:  # strings, nulls, huge values: one by one
            flow_ids = np.fromiter(map(_flow_id, ids), np.int64, flows.size)
        columns["flow_id"][offset + flows] = flow_ids
    external_lower = np.full(n, -1, np.int64)
    for group in schema.ARG_GROUPS:
        index = np.flatnonzero(kind_mask(kind, group.kinds))
        if index.size == 0:
            continue
        args = list(map(attrgetter("args"), itemgetter_list(events, index)))
        target = offset + index
        for column in group.columns:
            values: Iterable[Any] = map(attrgetter(column), args)
            if column == "external_id_lower":
                external_lower[index] = np.fromiter(values, np.int64, index.size)
            elif column in _RAW_TEXT_COLUMNS:
                columns[column][target] = np.fromiter(map(lookup, map(bytes, values)), np.int32, index.size)
            elif column in NUMERIC_COLUMNS:
                columns[column][target] = np.fromiter(values, NUMERIC_COLUMNS[column], index.size)
            else:
                columns[column][target] = np.fromiter(map(lookup, values), np.int32, index.size)
    np.maximum(columns["external_id"][rows], external_lower, out=columns["external_id"][rows])


def itemgetter_list(items: list[Any], index: np.ndarray) -> list[Any]:
    """`[items[i] for i in index]` at C speed."""
    if index.size == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def _flow_id(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else -1
    try:
        number = int(str(value), 0)
    except ValueError:  # a non-numeric id: a stable 63-bit digest (str hashes change between processes)
        digest = hashlib.blake2b(str(value).encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0x7FFFFFFFFFFFFFFF
    return number if -(2**63) <= number < 2**63 else -1


def _check_events(table: EventTable, path: Path | str, dropped: int) -> None:
    if len(table) == 0 and dropped:
        raise TraceFormatError(path, f"no usable events: all {dropped} event(s) are malformed")
    if len(table) == 0:
        raise TraceFormatError(path, "trace has no events")
    phases = {table.strings[i] for i in np.unique(table.columns["ph"]).tolist()}
    if not phases & {"X", "B", "E", "i", "I"}:
        raise TraceFormatError(path, "not a Kineto trace: no duration or instant events")


def _clean_times(table: EventTable, warnings: list[str], path: Path | str) -> None:
    ts = table.columns["ts_us"]
    dur = table.columns["dur_us"]
    bad_ts = ~np.isfinite(ts)
    metadata = table.columns["kind"] == Kind.METADATA
    if (bad_ts & metadata).any():  # process/thread names need no timestamp (Chrome trace format)
        first = float(ts[~bad_ts].min(initial=np.inf))
        ts[bad_ts & metadata] = first if np.isfinite(first) else 0.0
        bad_ts &= ~metadata
    if bad_ts.any():
        warnings.append(f"ignored {int(bad_ts.sum())} event(s) without a valid timestamp")
        keep = ~bad_ts
        table.columns = {k: v[keep] for k, v in table.columns.items()}
        ts, dur = table.columns["ts_us"], table.columns["dur_us"]
    missing = np.isnan(dur)
    dur[missing] = 0.0
    negative = dur < 0
    if negative.any():
        warnings.append(f"set {int(negative.sum())} negative duration(s) to 0")
        dur[negative] = 0.0
    huge = ~np.isfinite(dur)
    if huge.any():
        warnings.append(f"set {int(huge.sum())} infinite duration(s) to 0")
        dur[huge] = 0.0
    if not (table.columns["kind"] != Kind.METADATA).any():
        raise TraceFormatError(path, "no usable events: no event has a valid timestamp")


