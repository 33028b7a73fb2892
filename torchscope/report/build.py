"""Build a Report from a path: discover traces, analyse each rank (in parallel), merge, diagnose."""

from __future__ import annotations

import logging
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from torchscope import __version__
from torchscope.analysis.breakdown import DEVICE_CATEGORIES, PHASE_CATEGORIES
from torchscope.analysis.distributed import rank_summaries
from torchscope.analysis.operators import merge_operator_rows, merge_range_rows
from torchscope.analysis.rank import RankResult, analyze_rank, span_summary
from torchscope.errors import InputError, TorchscopeError
from torchscope.report.merge import merge_device, merge_kernel_rows, merge_memory, weighted_signals
from torchscope.report.model import CategoryTime, Report, RunInfo
from torchscope.trace.discover import discover
from torchscope.trace.load import group_by_worker
from torchscope.trace.manifest import read_manifests
from torchscope.trace.read import estimated_text_bytes
from torchscope.workers import process_pool

log = logging.getLogger(__name__)


def default_jobs() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


Progress = Callable[[int, int], None]  # (bytes of trace text analysed, bytes in all)


def analyze(
    path: str | Path | Sequence[str | Path],
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
) -> Report:
    """Load, analyse and diagnose the traces at `path` (file, trace directory or run directory).

    `progress`, if given, is called with (done, total) in bytes of trace text: as each batch of a trace
    is parsed in this process, and as each rank finishes in the process pool."""
    started = time.perf_counter()
    paths = [Path(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    refs = [ref for p in paths for ref in discover(p)]
    groups = group_by_worker(refs)
    with quiet_numerics():
        results, failures = _analyze_ranks(groups, jobs or default_jobs(), use_cache, progress or _no_progress)
        manifests = [m for p in paths for m in read_manifests(p)]
        report = assemble(results, manifests, [str(p) for p in paths])
        if failures:  # the other ranks still make a meaningful, partial report
            report.warnings = [f"{exc} (rank skipped)" for exc in failures] + report.warnings
            report.run.partial = True
        from torchscope.diagnose.engine import diagnose

        report.findings = diagnose(report)
    log.debug("analysed %d file(s) in %.3f s", len(refs), time.perf_counter() - started)
    return report


def _no_progress(done: int, total: int) -> None:
    return None


def _no_rank_done(index: int) -> None:
    return None


class _ByteProgress:
    """Bytes of trace text done, reported to a `Progress`: within a rank as its files are parsed, and
    exactly at each rank's end (a cached or failed file counts as done)."""

    def __init__(self, progress: Progress, groups: list[list[Any]]) -> None:
        self.progress = progress
        self.rank_bytes = [sum(_text_bytes(ref.path) for ref in group) for group in groups]
        self.total = sum(self.rank_bytes)
        self.finished = 0  # bytes of the ranks that are done
        self.current = 0  # bytes parsed in the rank under way
        self.ranks_done = 0
        progress(0, self.total)

    def parsed(self, nbytes: int) -> None:
        """Bytes parsed in the rank under way (ranks run in order here). Capped at the rank's size: a
        parse that falls back and starts over reports its bytes twice."""
        limit = self.rank_bytes[self.ranks_done] if self.ranks_done < len(self.rank_bytes) else 0
        self.current = min(self.current + nbytes, limit)
        self.progress(self.finished + self.current, self.total)

    def rank_done(self, index: int) -> None:
        self.finished += self.rank_bytes[index]
        self.ranks_done += 1
        self.current = 0
        self.progress(self.finished, self.total)


def _text_bytes(path: Path) -> int:
    return estimated_text_bytes(path) or 0


def _analyze_ranks(
    groups: list[list[Any]], jobs: int, use_cache: bool, progress: Progress
) -> tuple[list[RankResult], list[InputError]]:
    """Results of the ranks that could be analysed, and the input errors of those that could not."""
    total = len(groups)
    done = _ByteProgress(progress, groups)
    if jobs <= 1 or total <= 1:  # one rank: its large files are parsed on `jobs` processes instead
        def serial(i: int) -> RankResult:
            return analyze_rank(groups[i], use_cache, i, parse_jobs=jobs, on_bytes=done.parsed)

        return _collect(serial, total, done.rank_done)
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    try:
        with process_pool(min(jobs, total)) as pool:
            futures = [pool.submit(_analyze_rank_quietly, group, use_cache, i) for i, group in enumerate(groups)]
            index_of = {future: i for i, future in enumerate(futures)}
            for future in as_completed(futures):
                done.rank_done(index_of[future])
            return _collect(lambda i: futures[i].result(), total, _no_rank_done)
    except BrokenProcessPool:
        raise TorchscopeError(
            "a worker process died while analysing the ranks (out of memory?); retry with --jobs 1"
        ) from None


@contextmanager
def quiet_numerics() -> Iterator[None]:
    """No numpy RuntimeWarnings (all-NaN slices, 0/0) on stderr: damaged traces produce NaNs that the
    analyses handle, and the warnings would only break the CLI's one-line contract."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _analyze_rank_quietly(refs: list[Any], use_cache: bool, rank_fallback: int) -> RankResult:
    with quiet_numerics():
        return analyze_rank(refs, use_cache, rank_fallback)


def _collect(
    result_of: Callable[[int], RankResult], count: int, rank_done: Callable[[int], None]
) -> tuple[list[RankResult], list[InputError]]:
    results: list[RankResult] = []
    failures: list[InputError] = []
    for index in range(count):
        try:
            results.append(result_of(index))
        except InputError as exc:
            failures.append(exc)
        rank_done(index)
    if failures and not results:
        raise failures[0]
    return results, failures


def assemble(results: list[RankResult], manifests: list[dict[str, Any]], paths: list[str]) -> Report:
    results = sorted(results, key=lambda r: (r.rank, r.worker))
    spans = [span for r in results for span in r.spans]
    has_device = any(span.has_device for span in spans)
    steps = [s for r in results for s in r.steps]
    categories = DEVICE_CATEGORIES if has_device else PHASE_CATEGORIES
    mean_step = float(np.mean([s.duration_us for s in steps])) if steps else 0.0
    weights = [float(len(span.steps)) for span in spans]
    kinds = sorted({span.device_kind for span in spans})
    device_kind = next((k for k in ("cuda", "rocm") if k in kinds), "cpu")
    return Report(
        torchscope_version=__version__,
        run=RunInfo(
            paths=paths,
            trace_files=[span.file for span in spans],
            ranks=sorted({r.rank for r in results}),
            device_kind=device_kind,  # type: ignore[arg-type]
            step_source=spans[0].step_source if spans else "none",
            manifest=_manifest_summary(manifests),
            partial=any(span.warnings for span in spans) or any(m.get("status") not in (None, "complete", "stopped") for m in manifests),
        ),
        steps=steps,
        breakdown=_mean_breakdown(steps, categories, mean_step, phases=False),
        phases=_mean_breakdown(steps, PHASE_CATEGORIES, mean_step, phases=True),
        operators=merge_operator_rows([span.operators for span in spans]),
        operators_by_shape=merge_operator_rows([span.operators_by_shape for span in spans]),
        kernels=merge_kernel_rows([span.kernels for span in spans]),
        ranges=merge_range_rows([span.ranges for span in spans]),
        device=merge_device([(span.device, sum(s.duration_us for s in span.steps)) for span in spans]),
        memory=merge_memory([span.memory for span in spans]),
        ranks=rank_summaries(results),
        spans=[span_summary(span, r.rank) for r in results for span in r.spans],
        signals=weighted_signals([(span.signals, w) for span, w in zip(spans, weights)]),
        warnings=[f"{Path(span.file).name}: {w}" for span in spans for w in span.warnings],
    )


def _mean_breakdown(steps: list[Any], categories: Sequence[str], mean_step: float, phases: bool) -> dict[str, CategoryTime]:
    out: dict[str, CategoryTime] = {}
    for category in categories:
        values = [(s.phases if phases else s.breakdown).get(category, 0.0) for s in steps]
        mean = float(np.mean(values)) if values else 0.0
        out[category] = CategoryTime(us=mean, percent=100.0 * mean / mean_step if mean_step else 0.0)
    return out


_MANIFEST_KEYS = ("torchscope_version", "torch_version", "command", "host", "world_size", "schedule", "activities", "options", "status", "start_time", "steps_seen", "errors", "environment")


def _manifest_summary(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    if not manifests:
        return {}
    first = manifests[0]
    summary = {k: first[k] for k in _MANIFEST_KEYS if k in first}
    statuses = sorted({str(m.get("status")) for m in manifests if m.get("status")})
    if statuses:
        summary["status"] = statuses[0] if len(statuses) == 1 else statuses
    summary["manifests"] = len(manifests)
    return summary
