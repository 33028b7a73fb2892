"""One rank's extracts: for each of its trace files, every analysis's extract, read from the extract
cache when the file and the analysis are unchanged, else computed from the tables (which come from the
table cache, else from parsing). This is what a process-pool task runs; only the extracts cross back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import msgspec

from torchscope.analysis.registry import Analysis
from torchscope.analysis.span import SpanInput
from torchscope.analysis.span_meta import SpanMeta
from torchscope.pipeline import extract_cache
from torchscope.trace import cache as table_cache
from torchscope.trace.discover import TraceFileRef
from torchscope.trace.load import load_trace_file
from torchscope.trace.parse import BytesDone


class SpanExtracts(msgspec.Struct):
    """Every analysis's extract of one trace file, by analysis name ("span" holds its SpanMeta)."""

    values: dict[str, Any]

    @property
    def meta(self) -> SpanMeta:
        meta: SpanMeta = self.values["span"]
        return meta


class RankExtracts(msgspec.Struct):
    rank: int
    worker: str
    spans: list[SpanExtracts]  # in capture order
    rank_known: bool = True  # from a trace header or the worker's name, not the order of the workers


def extract_rank(
    refs: Sequence[TraceFileRef],
    analyses: Sequence[Analysis[Any]],
    use_cache: bool = True,
    rank_fallback: int = 0,
    parse_jobs: int = 1,
    on_bytes: BytesDone | None = None,
) -> RankExtracts:
    """Extracts of one rank's trace files (`parse_jobs` threads or processes may parse each large file;
    `on_bytes` follows the parsing, see `parse_trace`). `analyses` starts with the span metadata."""
    spans = [_span_extracts(ref.path, analyses, use_cache, parse_jobs, on_bytes) for ref in refs]
    spans.sort(key=lambda span: span.meta.first_ts_us)  # capture order (sort is stable for ties)
    rank = _rank_of(spans, refs)
    return RankExtracts(rank=rank_fallback if rank is None else rank, worker=refs[0].worker, spans=spans, rank_known=rank is not None)


def _span_extracts(
    path: Path, analyses: Sequence[Analysis[Any]], use_cache: bool, parse_jobs: int, on_bytes: BytesDone | None
) -> SpanExtracts:
    trace_key = _trace_key(path) if use_cache else None
    entry = extract_cache.load(path, trace_key) if trace_key is not None else {}
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    missing = []
    for analysis in analyses:
        if trace_key is None:
            missing.append(analysis)
            continue
        keys[analysis.name] = extract_cache.fingerprint(analysis, trace_key)
        hit, value = extract_cache.cached_value(entry, analysis, keys[analysis.name])
        if hit:
            values[analysis.name] = value
        else:
            missing.append(analysis)
    if missing:
        span = SpanInput(load_trace_file(path, use_cache, parse_jobs, on_bytes))
        for analysis in missing:
            values[analysis.name] = analysis.extract(span)
        if trace_key is not None:
            extract_cache.store(path, trace_key, {name: (keys[name], values[name]) for name in keys})
    meta = values.get("span")
    if isinstance(meta, SpanMeta) and meta.file != str(path):
        # A cached extract keeps the path the file had when it was cached (relative to another folder,
        # or absolute): the file is where it was found this time.
        values["span"] = msgspec.structs.replace(meta, file=str(path))
    return SpanExtracts(values)


def _trace_key(path: Path) -> str | None:
    try:
        return table_cache.cache_key(path)
    except OSError:  # unreadable: skip the cache, and let parsing report the problem
        return None


def _rank_of(spans: list[SpanExtracts], refs: Sequence[TraceFileRef]) -> int | None:
    """The trace header's distributedInfo.rank, else a rank in the worker's name (None: neither)."""
    for span in spans:
        if span.meta.header_rank is not None:
            return span.meta.header_rank
    for ref in refs:
        if ref.rank_hint is not None:
            return ref.rank_hint
    return None
