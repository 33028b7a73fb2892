"""Decoding batches of Kineto events: the compiled scanner where it is built and the batch has the strict
shape it decodes exactly, else msgspec, else event by event with lenient coercion (malformed events are
dropped and counted). Shared by the streaming parser (`parse.py`) and the byte-range workers
(`ranges.py`)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import msgspec

from torchscope.trace import fastscan, schema
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.stream import Span, bracketed
from torchscope.trace.validate import clean_header

_MAX_HEADER_VALUE_BYTES = 64 << 20

DecodedBatch = tuple[list[schema.Event], int]  # decoded events, and how many malformed ones were dropped
Batch = Union[fastscan.ScannedBatch, DecodedBatch]  # what `batch_decoder` gives: columns, or decoded events


def batch_decoder(builder: ColumnBuilder) -> Callable[[bytes, Optional[Span]], Optional[Batch]]:
    """Decode the events of a JSON array for `builder` (see `EventStream` for `text` and `span`): with the
    compiled scanner when it is built and the batch has the strict shape it decodes exactly, in place;
    with msgspec otherwise (`decode_array`). None when the text is not a JSON array (a false cut: only
    msgspec decides that)."""
    if not fastscan.available():
        return lambda text, span: decode_array(bracketed(text, span))
    scanner = fastscan.BatchScanner(builder.interner)

    def decode(text: bytes, span: Span | None) -> Batch | None:
        scanned = scanner.scan(text, span)
        return scanned if scanned is not None else decode_array(bracketed(text, span))

    return decode


def decode_array(text: bytes) -> DecodedBatch | None:
    """A JSON array of events, decoded; None when `text` is not a JSON array (a false cut)."""
    try:
        return schema.EVENT_LIST_DECODER.decode(text), 0
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass
    try:
        raw = schema.RAW_LIST_DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return decode_leniently(raw)


def decode_header(raw_header: dict[str, msgspec.Raw]) -> dict[str, Any]:
    header: dict[str, Any] = {}
    for key, value in raw_header.items():
        if len(value) > _MAX_HEADER_VALUE_BYTES:
            continue  # never let a foreign, giant header field dominate memory
        try:
            header[key] = msgspec.json.decode(value)
        except (msgspec.DecodeError, RecursionError):
            continue
    return clean_header(header)


def decode_leniently(raws: list[msgspec.Raw]) -> DecodedBatch:
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
