"""Parse Kineto Chrome-trace JSON into an `EventTable`.

How: the text is read in chunks and its events array is cut into batches of a few MB at event
boundaries (`stream.EventStream`); each batch is decoded with msgspec into small typed structs
(`schema.Event`, with the args torchscope reads) and written into preallocated numpy columns
(`columns.ColumnBuilder`), then dropped. One large plain file can be parsed in byte ranges on several
threads, or processes without the compiled scanner (`ranges.py`). Peak memory is the columns plus one
batch, whatever the file size: the JSON text is never held whole. Strings are interned as they are seen. A batch whose events do not all fit the strict shape is
decoded event by event with type coercion; events that still do not fit are dropped and counted. Text
that the streaming walk cannot follow (non-standard NaN literals, UTF-16, damage) is parsed whole, which
also gives the precise error for a damaged file.
"""

from __future__ import annotations

import codecs
import logging
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import msgspec
import numpy as np

from torchscope.errors import TraceFormatError
from torchscope.text import path_text
from torchscope.trace import ranges, schema, validate
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.sparse import select_rows
from torchscope.trace.kinds import Kind
from torchscope.trace.read import GZIP_MAGIC, estimated_text_bytes, iter_trace_chunks, read_trace_bytes
from torchscope.trace.decode import Batch, DecodedBatch, batch_decoder, decode_array, decode_header, decode_leniently
from torchscope.trace.stream import BATCH_BYTES, EventStream, NotStreamable, locate_events
from torchscope.trace.tables import EventTable, TraceFile

log = logging.getLogger(__name__)

BATCH_EVENTS = 100_000  # events per batch when a whole text is parsed (the fallback path)

BytesDone = Callable[[int], None]  # called with the bytes of text parsed since the last call


def _ignore_bytes(nbytes: int) -> None:
    return None


def parse_trace(path: Path, jobs: int = 1, on_bytes: BytesDone | None = None) -> TraceFile:
    """Read and parse one trace file, streaming it (the text is never held whole when it can be helped).

    With `jobs` > 1, a large uncompressed file is parsed in byte ranges on that many threads (processes
    without the compiled scanner).
    `on_bytes`, if given, is told how much text has been parsed as the parse goes (for a progress bar)."""
    report = on_bytes or _ignore_bytes
    if jobs > 1 and _splittable(path):
        from concurrent.futures.process import BrokenProcessPool  # only this path starts processes

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
        return plain and path.stat().st_size >= ranges.min_parallel_bytes()
    except OSError:
        return False  # the sequential path reports the problem


def _parse_parallel(path: Path, jobs: int, on_bytes: BytesDone) -> TraceFile:
    """Parse a plain file in byte ranges on `jobs` threads or processes (see `trace/ranges.py`)."""
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
    return TraceFile(path_text(path), header, table, warnings)


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
    builder = ColumnBuilder(size_hint)
    stream: EventStream[Batch] = EventStream(_without_utf8_bom(chunks), batch_decoder(builder), batch_bytes)
    reported = 0
    for batch in stream.batches():
        builder.add_batch(batch, stream.consumed)
        on_bytes(stream.consumed - reported)
        reported = stream.consumed
    if builder.filled == 0 and builder.dropped == 0 and stream.consumed == 0:
        raise NotStreamable("empty")  # let the whole-text path name the problem
    warnings: list[str] = []
    table, dropped = builder.finish(warnings)
    header = decode_header(stream.header)
    _check_events(table, path, dropped)
    _clean_times(table, warnings, path)
    return TraceFile(path_text(path), header, table, warnings)


def _without_utf8_bom(chunks: Iterable[bytes]) -> Iterator[bytes]:
    first = True
    for chunk in chunks:
        if first and chunk.startswith(codecs.BOM_UTF8):
            chunk = chunk[len(codecs.BOM_UTF8) :]
        first = False
        yield chunk


def _parse_whole(data: bytes | bytearray, path: Path | str) -> TraceFile:
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
    return TraceFile(path_text(path), header, table, warnings)


def _to_utf8(data: bytes | bytearray, path: Path | str) -> bytes | bytearray:
    """Drop a UTF-8 byte-order mark; re-encode UTF-16 (with its BOM) as UTF-8."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16").encode("utf-8", "surrogatepass")
        except UnicodeError:
            raise TraceFormatError(path, "damaged UTF-16 text") from None
    return data


def _decode_top_level(data: bytes | bytearray, path: Path | str, warnings: list[str]) -> Any:
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


def _has_non_standard_literal(data: bytes | bytearray, exc: Exception) -> bool:
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


def _describe_decode_error(exc: Exception, data: bytes | bytearray) -> str:
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


def _event_batches(raw_events: list[msgspec.Raw], path: Path | str) -> Iterator[DecodedBatch]:
    """Decoded events in batches, with the number of malformed events dropped from each."""
    for start in range(0, len(raw_events), BATCH_EVENTS):
        batch = raw_events[start : start + BATCH_EVENTS]
        decoded = decode_array(b"[" + b",".join(batch) + b"]")
        yield decoded if decoded is not None else decode_leniently(batch)


def _check_events(table: EventTable, path: Path | str, dropped: int) -> None:
    if len(table) == 0 and dropped:
        raise TraceFormatError(path, f"no usable events: all {dropped} event(s) are malformed")
    if len(table) == 0:
        raise TraceFormatError(path, "trace has no events")
    phases = {table.strings[i] for i in np.flatnonzero(np.bincount(table.columns["ph"])).tolist()}  # ids in use
    if not phases & {"X", "B", "E", "i", "I"}:
        raise TraceFormatError(path, "not a Kineto trace: no duration or instant events")


def _clean_times(table: EventTable, warnings: list[str], path: Path | str) -> None:
    ts = table.columns["ts_us"]
    dur = table.columns["dur_us"]
    bad_ts = validate.implausible_timestamps(ts)
    metadata = table.columns["kind"] == Kind.METADATA
    if (bad_ts & metadata).any():  # process/thread names need no timestamp (Chrome trace format)
        first = float(ts[~bad_ts].min(initial=np.inf))
        ts[bad_ts & metadata] = first if np.isfinite(first) else 0.0
        bad_ts &= ~metadata
    if bad_ts.any():
        warnings.append(f"ignored {int(bad_ts.sum())} event(s) without a valid timestamp")
        keep = ~bad_ts
        table.columns = {k: select_rows(v, keep) for k, v in table.columns.items()}
        ts, dur = table.columns["ts_us"], table.columns["dur_us"]
    missing = np.isnan(dur)
    dur[missing] = 0.0
    negative = dur < 0
    if negative.any():
        warnings.append(f"set {int(negative.sum())} negative duration(s) to 0")
        dur[negative] = 0.0
    huge = validate.implausible_durations(dur)
    if huge.any():  # infinite, or longer than any capture: sums and percentages must stay finite
        warnings.append(f"set {int(huge.sum())} infinite or implausible duration(s) (over {validate.MAX_DURATION_US:.0e} us) to 0")
        dur[huge] = 0.0
    if not (table.columns["kind"] != Kind.METADATA).any():
        raise TraceFormatError(path, "no usable events: no event has a valid timestamp")


