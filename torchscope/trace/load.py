"""Load trace files into `TraceFile` tables, through the persistent cache."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from torchscope.trace import cache
from torchscope.trace.discover import TraceFileRef, discover
from torchscope.trace.parse import BytesDone, parse_trace
from torchscope.trace.tables import TraceFile

log = logging.getLogger(__name__)


def load_trace_file(
    path: Path, use_cache: bool = True, jobs: int = 1, on_bytes: BytesDone | None = None
) -> TraceFile:
    """Parse one trace file, or read its tables from the cache when the file is unchanged.

    `jobs` > 1 parses a large file on that many threads (processes without the compiled scanner); `on_bytes` follows the parse (see parse_trace)."""
    started = time.perf_counter()
    try:
        key = cache.cache_key(path) if use_cache else ""
    except OSError:  # unreadable: skip the cache, and let parsing report the problem
        use_cache = False
    if use_cache:
        cached = cache.load_cached(path, key)
        if cached is not None:
            log.debug("%s: cache hit (%.3f s)", path, time.perf_counter() - started)
            return cached
    trace = parse_trace(path, jobs, on_bytes)
    log.debug("%s: parsed %d events (%.3f s)", path, len(trace.events), time.perf_counter() - started)
    if use_cache:
        cache.store(path, key, trace)
    return trace


def load_run(path: str | Path, use_cache: bool = True) -> dict[str, list[TraceFile]]:
    """All traces under `path`, grouped by worker name (one list of spans per worker)."""
    grouped: dict[str, list[TraceFile]] = {}
    for ref in discover(Path(path)):
        grouped.setdefault(ref.worker, []).append(load_trace_file(ref.path, use_cache))
    return grouped


def group_by_worker(refs: list[TraceFileRef]) -> list[list[TraceFileRef]]:
    groups: dict[str, list[TraceFileRef]] = {}
    for ref in refs:
        groups.setdefault(ref.worker, []).append(ref)
    return list(groups.values())
