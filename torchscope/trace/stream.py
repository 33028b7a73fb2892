"""Walk a Chrome-trace JSON text chunk by chunk: the header fields, then the events in batches.

Why: holding a multi-GB JSON text while it is decoded costs as much memory as the text itself, on top
of the tables. Here the events array is cut at event boundaries and each piece is decoded on its own
and dropped, so the text held at once is one batch (a few MB) whatever the file size.

How a cut is found: a boundary looks like `}` `,` `{` (a regular expression finds the last one in the
text read so far), and it is confirmed by decoding `[` + piece + `]`: a cut inside a string or inside a
nested object never decodes, so a false candidate is rejected and an earlier one tried. The header keys
before `"traceEvents"` are confirmed the same way (they must decode as an object). At the end of the
text, the rest is decoded as `{"traceEvents":[` + rest, which yields the last events and the keys that
follow the array (Kineto writes `traceName`, `displayTimeUnit`, `baseTimeNanoseconds` there).

Anything else (no `traceEvents` key near the top, a boundary that cannot be confirmed, malformed text,
non-standard literals) raises `NotStreamable`, and the caller parses the whole text instead, which also
gives the precise error for a damaged file.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Generic, Iterable, Iterator, Optional, TypeVar

import msgspec

from torchscope.trace.schema import RAW_LIST_DECODER, RAW_OBJECT_DECODER

T = TypeVar("T")

BATCH_BYTES = 2 << 20
# The header before `traceEvents`, and a single event, may be at most this large for streaming.
MAX_PIECE_BYTES = 64 << 20
_KEY = b'"traceEvents"'
# JSON whitespace is exactly these four characters (not `\s`, which also matches \x0b and \x0c).
EVENT_SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_AFTER_CUT = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")  # what follows a cut, before the next event
_WHITESPACE_RUN = re.compile(rb"[ \t\r\n]*")
_EVENTS_KEY = "\x00torchscope-events"  # stands for "traceEvents" when the end of the text is decoded
_CUT_ATTEMPTS = 4
_STOP_ATTEMPTS = 64
_SEARCH_WINDOW = 1 << 16
_WHITESPACE = b" \t\r\n"


_ERROR_OFFSET = re.compile(r"\(byte (\d+)\)")


_CUT_INSIDE = "cut inside a value"
_PAST_THE_END = "cut past the end of the events array"
_MALFORMED = "malformed"
Span = tuple[int, int]  # (start, end) of an array's comma-separated events in a text, brackets excluded


def bracketed(text: bytes, span: Span | None) -> bytes:
    """The JSON array a decoder is given: `text` itself, or `[` + text[start:end] + `]`."""
    return text if span is None else b"".join((b"[", memoryview(text)[span[0] : span[1]], b"]"))


def _why_undecodable(text: bytes) -> str:
    """Why `[` + piece + `]` did not decode: the cut fell inside a string or nested value (the error is at
    the very end), past the `]` that closes the events array (trailing characters), or the text is
    malformed earlier on."""
    try:
        RAW_LIST_DECODER.decode(text)
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "trailing characters" in message:
            return _PAST_THE_END
        offset = _ERROR_OFFSET.search(message)
        if "truncated" in message or (offset is not None and int(offset.group(1)) >= len(text) - 1):
            return _CUT_INSIDE
        return _MALFORMED
    except RecursionError:
        return _MALFORMED
    return _MALFORMED  # valid JSON that `decode` refused: not a cut problem


class NotStreamable(Exception):
    """The text does not have the layout the streaming walk relies on: parse it whole instead."""


def locate_events(chunks: Iterable[bytes]) -> tuple[dict[str, msgspec.Raw], int, bool]:
    """The header keys before the events array, the offset just after its `[`, and whether the
    document is an object (False for a bare array)."""
    stream: EventStream[Any] = EventStream(chunks, lambda text, span: None)
    stream._open()
    return stream.header, stream.events_start, stream._object


class EventStream(Generic[T]):
    """Decoded event batches of a Chrome-trace text given in chunks; `header` once they are exhausted.

    `decode(text, span)` decodes the events of `bracketed(text, span)`: the JSON array `text` (span None)
    or the events between the buffer's offsets `span` (no copy of them is made for a decoder that can
    read them in place). It returns None when that is not a valid JSON array (which is how a false cut
    is rejected).

    For parsing byte ranges in parallel (`trace/ranges.py`): `inside` says the chunks start inside the
    events array, at an event (True for an object document, False for a bare array), `origin` is the
    offset of the first chunk in the whole text, and `stop_at` ends the stream at the first confirmed
    boundary at or after that offset (`next_start` is then where the next event begins)."""

    def __init__(
        self,
        chunks: Iterable[bytes],
        decode: Callable[[bytes, Optional[Span]], Optional[T]],
        batch_bytes: int = BATCH_BYTES,
        *,
        inside: bool | None = None,
        origin: int = 0,
        stop_at: int | None = None,
    ) -> None:
        self._chunks = iter(chunks)
        self._decode = decode
        self._batch_bytes = batch_bytes
        self._eof = False
        self._inside = inside
        self._object = True if inside is None else inside  # False for a bare event array
        self._origin = origin  # offset in the whole text of the buffer's first byte
        self._stop_at = stop_at
        self.header: dict[str, msgspec.Raw] = {}
        self.events_start = origin  # offset just after the `[` that opens the events array
        self.next_start: int | None = None  # set when the stream stopped at `stop_at`
        self.consumed = 0  # bytes of text decoded so far
        self._at_start = True  # no event decoded yet: only whitespace may precede the first one

    def batches(self) -> Iterator[T]:
        buffer = self._open() if self._inside is None else b""
        target = self._batch_bytes
        while True:
            buffer = self._fill(buffer, target)
            stopping = self._stop_at is not None and self._origin + len(buffer) > self._stop_at
            if self._eof and not stopping:
                break
            decoded, rest = self._cut_at_stop(buffer) if stopping else self._cut(buffer)
            if decoded is None and self._eof:
                break  # no boundary after `stop_at`: this range runs to the end of the events
            if decoded is None:  # no confirmed boundary yet: the piece holds a large event; read more
                if len(buffer) > MAX_PIECE_BYTES:
                    raise NotStreamable("no event boundary")
                target = len(buffer) * 2
                continue
            self._advance(len(buffer) - len(rest))
            self._at_start = False
            target = self._batch_bytes
            buffer = rest
            yield decoded
            if stopping:
                self.next_start = self._origin + self._begin(rest)
                return
        yield from self._finish(buffer)

    def _begin(self, buffer: bytes) -> int:
        """Where the next event starts in `buffer`: after whitespace at the start of the array, after
        the `,` that follows the previous event otherwise."""
        match = (_WHITESPACE_RUN if self._at_start else _AFTER_CUT).match(buffer)
        if match is None:
            raise NotStreamable("malformed events (no comma between events)")
        return match.end()

    def _advance(self, nbytes: int) -> None:
        self._origin += nbytes
        self.consumed += nbytes

    def _read(self) -> bytes:
        chunk = next(self._chunks, b"")
        if not chunk:
            self._eof = True
        return chunk

    def _fill(self, buffer: bytes, target: int) -> bytes:
        parts = [buffer]
        size = len(buffer)
        while size < target and not self._eof:
            chunk = self._read()
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts) if len(parts) > 1 else buffer

    def _open(self) -> bytes:
        """Read up to the `[` that opens the events array; return the text after it."""
        buffer = self._fill(b"", min(1 << 16, self._batch_bytes))
        start = len(buffer) - len(buffer.lstrip(_WHITESPACE))
        first = buffer[start : start + 1]
        if first == b"[":
            self._object = False
            self._advance(start + 1)
            self.events_start = self._origin
            return buffer[start + 1 :]
        if first != b"{":
            raise NotStreamable("not an object or array")
        search_from = start
        while True:
            position = buffer.find(_KEY, search_from)
            if position < 0 or (len(buffer) - position < 64 and not self._eof):
                if self._eof or len(buffer) > MAX_PIECE_BYTES:
                    raise NotStreamable("no traceEvents key near the top")
                buffer = self._fill(buffer, len(buffer) * 2)
                continue
            header = self._header_before(buffer[start:position])
            if header is None:
                search_from = position + 1
                continue
            after = buffer[position + len(_KEY) :].lstrip(_WHITESPACE)
            if after[:1] != b":" or after[1:].lstrip(_WHITESPACE)[:1] != b"[":
                raise NotStreamable("traceEvents is not an array")
            self.header = header
            opened = len(buffer) - len(after[1:].lstrip(_WHITESPACE)) + 1
            self._advance(opened)
            self.events_start = self._origin
            return buffer[opened:]

    @staticmethod
    def _header_before(prefix: bytes) -> dict[str, msgspec.Raw] | None:
        """The object keys before `"traceEvents"`, or None when the key is not at the top level."""
        prefix = prefix.rstrip(_WHITESPACE)
        if prefix == b"{":
            return {}
        if not prefix.endswith(b","):
            return None
        try:
            return RAW_OBJECT_DECODER.decode(prefix[:-1] + b"}")
        except (msgspec.DecodeError, RecursionError):
            return None

    def _cut(self, buffer: bytes) -> tuple[T | None, bytes]:
        """Decode the events before the last confirmed boundary; the rest of the text stays buffered."""
        window = _SEARCH_WINDOW
        while True:  # the last few boundaries: search the end of the text first, widening if none is there
            start = max(0, len(buffer) - window)
            ends = [m.start() for m in EVENT_SEPARATOR.finditer(buffer, start)]
            if ends or start == 0:
                break
            window *= 8
        begin = self._begin(buffer)
        for end in reversed([end for end in ends[-_CUT_ATTEMPTS:] if end >= begin]):
            decoded = self._decode(buffer, (begin, end + 1))
            if decoded is not None:
                return decoded, buffer[end + 1 :]
            if _why_undecodable(bracketed(buffer, (begin, end + 1))) == _MALFORMED:
                raise NotStreamable("malformed events")
            # Cut inside a value, or past the array's end (a look-alike in what follows it): try an
            # earlier boundary, or read on.
        return None, buffer

    def _cut_at_stop(self, buffer: bytes) -> tuple[T | None, bytes]:
        """Decode the events up to the first confirmed boundary at or after `stop_at`."""
        begin = self._begin(buffer)
        first = max(begin, self._stop_at - self._origin)  # type: ignore[operator]
        for attempt, match in enumerate(EVENT_SEPARATOR.finditer(buffer, first)):
            if attempt == _STOP_ATTEMPTS:  # a long run of look-alikes: let the caller parse sequentially
                raise NotStreamable("no confirmed boundary after the range end")
            decoded = self._decode(buffer, (begin, match.start() + 1))
            if decoded is not None:
                return decoded, buffer[match.start() + 1 :]
            reason = _why_undecodable(bracketed(buffer, (begin, match.start() + 1)))
            if reason == _MALFORMED:
                raise NotStreamable("malformed events")
            if reason == _PAST_THE_END:
                break  # the events end before `stop_at`: this range runs to their end
        return None, buffer

    def _finish(self, rest: bytes) -> Iterator[T]:
        """The last events and the keys after the array, from the text left at the end."""
        rest = rest[self._begin(rest) :]
        self._advance(len(rest))
        if not self._object:
            decoded = self._decode(b"[" + rest, None)
            if decoded is None:
                raise NotStreamable("malformed end of the events array")
            yield decoded
            return
        try:
            tail = RAW_OBJECT_DECODER.decode(b'{"\\u0000torchscope-events":[' + rest)
        except (msgspec.DecodeError, RecursionError):
            raise NotStreamable("malformed end of the document") from None
        events = tail.pop(_EVENTS_KEY, None)
        if events is None or "traceEvents" in tail:  # a repeated key: the whole-text parse keeps the last
            raise NotStreamable("traceEvents key repeated")
        decoded = self._decode(bytes(events), None)
        if decoded is None:
            raise NotStreamable("malformed last events")
        self.header.update(tail)
        yield decoded
