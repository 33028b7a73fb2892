"""Parse one large, uncompressed trace file in byte ranges on several threads (or processes).

Why: turning text into columns keeps one core busy (about 0.3 s per 100 MB with the compiled scanner,
several times that with msgspec) while the others idle. Byte ranges of a plain file can be parsed
independently once each starts at an event boundary. The compiled scanner reads the text without the
GIL, so ranges run on threads: no process start-up and no pickling of the parts. Below 64 MB the
parts in flight cost more memory (~14 MB at 48 MB) than the split saves time (measured: 0.20 s vs 0.22 s
for a 48 MB file). Without the scanner (msgspec holds the GIL), ranges run on processes, from 48 MB.

How: the parent walks the top of the file to the `[` that opens the events array. Range 0 starts there;
range k starts at the first `}`,`{` boundary at or after its nominal offset, and every range but the last
stops at the first boundary at or after the next range's nominal offset, confirmed by decoding from its
own confirmed start (`EventStream(stop_at=...)`). A later range's start is only a guess (a boundary
look-alike inside a string could fool it), so the parent checks that each range starts exactly where the
previous one stopped; if any does not, or a worker cannot follow its range, the caller parses the file
sequentially. The parts come back in order and are appended to growing columns, string ids remapped to
the parent's string table, so at most a few parts are held besides the result.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import msgspec
import numpy as np

from torchscope.trace import fastscan
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.decode import Batch, batch_decoder, decode_header
from torchscope.trace.read import READ_CHUNK_BYTES
from torchscope.trace.stream import EVENT_SEPARATOR, MAX_PIECE_BYTES, EventStream, NotStreamable
from torchscope.workers import process_pool

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

# Files at least this large are split. Ranges are about RANGE_BYTES (at least MIN_RANGE_BYTES, and at
# least RANGES_PER_JOB per worker so a slow range does not leave the others idle): a small part is a
# small transfer, and at most `jobs + 1` parts are in flight, which bounds the parent's extra memory.
# A process costs a start and a pickled part, so it needs larger files and ranges than a thread.
PARALLEL_MIN_BYTES = 48 << 20
MIN_RANGE_BYTES = 12 << 20
THREAD_PARALLEL_MIN_BYTES = 64 << 20
THREAD_MIN_RANGE_BYTES = 8 << 20
RANGE_BYTES = 32 << 20
RANGES_PER_JOB = 4


def on_threads() -> bool:
    """Whether ranges run on threads (the compiled scanner releases the GIL) rather than processes."""
    return fastscan.available()


def min_parallel_bytes() -> int:
    """The smallest file worth splitting."""
    return THREAD_PARALLEL_MIN_BYTES if on_threads() else PARALLEL_MIN_BYTES


class RangePart(msgspec.Struct):
    """What one worker returns for its byte range."""

    columns: dict[str, np.ndarray]
    keys: list[Any]  # the values behind the part's string ids, in id order (see ColumnBuilder.parts)
    dropped: int
    first_start: int  # offset of the range's first event
    next_start: int | None  # offset of the event after its last one; None when the range ran to the end
    header: dict[str, Any]  # the keys after the events array (last range only)


def plan_ranges(size: int, events_start: int, jobs: int) -> list[int]:
    """Nominal start offsets of the ranges (the first is the events array's start)."""
    events_bytes = size - events_start
    wanted = max(jobs * RANGES_PER_JOB, events_bytes // RANGE_BYTES)
    count = max(1, min(wanted, events_bytes // (THREAD_MIN_RANGE_BYTES if on_threads() else MIN_RANGE_BYTES)))
    step = (size - events_start) // count
    return [events_start + i * step for i in range(count)]


def parse_ranges(path: Path, events_start: int, object_mode: bool, jobs: int) -> Iterator[RangePart]:
    """The parts of the file, in order, parsed on `jobs` threads or processes; NotStreamable when the ranges do not
    join up exactly (the caller then parses sequentially)."""
    size = path.stat().st_size
    starts = plan_ranges(size, events_start, jobs)
    stops: list[int | None] = [*starts[1:], None]
    tasks = [(str(path), start, stop, object_mode, index == 0) for index, (start, stop) in enumerate(zip(starts, stops))]
    with _pool(min(jobs, len(tasks))) as pool:
        pending: deque[Future[RangePart]] = deque()
        submitted = 0
        try:
            expected = events_start
            for index in range(len(tasks)):
                while submitted < len(tasks) and len(pending) <= jobs:
                    pending.append(pool.submit(parse_range, *tasks[submitted]))
                    submitted += 1
                part = pending.popleft().result()
                if part.first_start != expected:
                    raise NotStreamable("byte ranges do not join up")
                yield part
                if part.next_start is None:
                    if index != len(tasks) - 1:
                        raise NotStreamable("a range ran past the end of the events")
                    return
                expected = part.next_start
        finally:
            for future in pending:
                future.cancel()


def _pool(workers: int) -> Executor:
    if on_threads():
        from concurrent.futures import ThreadPoolExecutor

        return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="torchscope-range")
    return process_pool(workers)


def parse_range(path: str, start: int, stop: int | None, object_mode: bool, exact_start: bool) -> RangePart:
    """Parse the events of one byte range (run in a worker thread or process)."""
    with open(path, "rb") as handle:
        if exact_start:
            first_start = start
        else:
            boundary, first_start = _first_boundary(handle, start)
            if stop is not None and boundary >= stop:  # an event spans the whole range: nothing of its own
                columns, keys, _ = ColumnBuilder(None).parts()
                return RangePart(columns, keys, 0, first_start, first_start, {})
        handle.seek(first_start)
        chunks = iter(lambda: handle.read(READ_CHUNK_BYTES), b"")
        builder = ColumnBuilder((stop if stop is not None else Path(path).stat().st_size) - first_start)
        stream: EventStream[Batch] = EventStream(
            chunks, batch_decoder(builder), inside=object_mode, origin=first_start, stop_at=stop
        )
        for batch in stream.batches():
            builder.add_batch(batch, stream.consumed)
    columns, keys, dropped = builder.parts()
    header = decode_header(stream.header) if stop is None else {}
    return RangePart(columns, keys, dropped, first_start, stream.next_start, header)


def _first_boundary(handle: Any, start: int) -> tuple[int, int]:
    """Offsets of the first event boundary at or after `start` (its `}`) and of the `{` after it."""
    handle.seek(start)
    text = b""
    while len(text) < MAX_PIECE_BYTES:
        chunk = handle.read(READ_CHUNK_BYTES)
        if not chunk:
            break
        text += chunk
        match = EVENT_SEPARATOR.search(text)
        if match is not None:
            return start + match.start(), start + match.end() - 1
    raise NotStreamable("no event boundary in a range")
