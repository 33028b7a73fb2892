"""`analyze(path)`: discover the traces, extract every analysis per rank (in parallel, through the
caches), reduce them into a Report, diagnose it and compute its metrics."""

from __future__ import annotations

import logging
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Sequence

import msgspec
import numpy as np

from torchscope.analysis import garbage_collection, loader_restarts, overhead, phase_clock
from torchscope.analysis.catalogue import all_analyses
from torchscope.analysis.registry import Analysis
from torchscope.analysis.timeline import align_ranks
from torchscope.diagnose.engine import diagnose
from torchscope.errors import InputError, TorchscopeError
from torchscope.files import write_atomic
from torchscope.pipeline import step_spread
from torchscope.pipeline.assemble import assemble
from torchscope.pipeline.manifests import run_manifest
from torchscope.pipeline.progress import ByteProgress, Progress, no_progress
from torchscope.pipeline.rank_extracts import RankExtracts, extract_rank
from torchscope.pipeline.rank_merge import merge_same_rank, training_spans
from torchscope.report.metrics import metrics_of
from torchscope.report.model import Report
from torchscope.rundir.layout import SIDECARS_DIR, sidecar_name
from torchscope.text import path_text
from torchscope.trace.discover import TraceFileRef, discover_all
from torchscope.trace.load import group_by_worker
from torchscope.workers import process_pool

log = logging.getLogger(__name__)


def default_jobs() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


class RunAnalysis(msgspec.Struct):
    """A run's Report and its sidecars (run-level data kept out of the Report, by name)."""

    report: Report
    sidecars: dict[str, Any]


def analyze(
    path: str | Path | Sequence[str | Path],
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
    cluster: str | None = None,
) -> Report:
    """Load, analyse and diagnose the traces at `path` (file, trace directory or run directory, or a list).

    `jobs`: ranks analysed in parallel processes, or threads parsing one large trace (default: CPUs).
    `use_cache`: read and write the table and extract caches. `progress`, if given, is called with
    (done, total) in bytes of trace text. `cluster`: extract the ranks on this Dask scheduler (or "local",
    pipeline/cluster.py) instead of the local pool. Raises `InputError` (one-line message) on unusable input."""
    return analyze_run(path, jobs, use_cache, progress, sidecars=(), cluster=cluster).report


def analyze_run(
    path: str | Path | Sequence[str | Path],
    jobs: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
    sidecars: Collection[str] | None = None,
    cluster: str | None = None,
) -> RunAnalysis:
    """`analyze`, with the sidecars of the analyses that produce them: the built-in ones named in
    `sidecars` (None: all, e.g. the timeline lanes the HTML dashboard draws) and every plug-in's."""
    started = time.perf_counter()
    paths = [Path(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    found = discover_all(paths)
    refs = found.refs
    analyses = all_analyses(sidecars)
    with quiet_numerics():
        if cluster is None:
            ranks, failures = _extract_ranks(group_by_worker(refs), analyses, jobs or default_jobs(), use_cache, progress or no_progress)
        else:
            ranks, failures = _cluster_ranks(group_by_worker(refs), analyses, jobs or default_jobs(), use_cache, cluster)
        ranks, merge_warnings = merge_same_rank(ranks)
        kept = [training_spans(rank) for rank in ranks]
        ranks = [rank for rank, _ in kept]
        manifest, statuses = run_manifest(paths)
        report, sidecars = assemble(ranks, analyses, manifest, statuses, [path_text(p) for p in paths])
        report.warnings += merge_warnings + [warning for _, left_out in kept for warning in left_out]  # after the damage ones
        if failures:  # the other ranks still make a meaningful, partial report
            report.warnings = [f"{exc} (rank skipped)" for exc in failures] + report.warnings
            report.run.partial = True
        if found.warnings:  # unreadable folders, FIFOs named like traces: some traces may be missing
            report.warnings = found.warnings + report.warnings
            report.run.partial = True
        overhead.correct(report)  # needs the manifest's step clock: after assembly, before the rules
        garbage_collection.from_step_clock(report)
        loader_restarts.from_step_clock(report)
        phase_clock.from_step_clock(report)
        step_spread.fill(report)  # every rank's steps and the step clock: run-level too
        if "timeline" in sidecars:  # ranks' clocks aligned by the offsets the distributed analysis measured
            sidecars["timeline"] = align_ranks(sidecars["timeline"], {r.rank: r.clock_offset_us for r in report.distributed.ranks}, report.run.manifest.get("hosts"))
        report.metrics = metrics_of(report)
        report.findings = diagnose(report)
    log.debug("analysed %d file(s) in %.3f s", len(refs), time.perf_counter() - started)
    return RunAnalysis(report, sidecars)


def write_sidecars(run_dir: Path, sidecars: dict[str, Any]) -> list[Path]:
    """Write each sidecar as MessagePack under the run directory's `sidecars/`; the paths written."""
    folder = run_dir / SIDECARS_DIR
    written = []
    for name, value in sidecars.items():
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / sidecar_name(name)
        write_atomic(path, msgspec.msgpack.encode(value))
        written.append(path)
    return written


@contextmanager
def quiet_numerics() -> Iterator[None]:
    """No numpy RuntimeWarnings (all-NaN slices, 0/0) on stderr: damaged traces produce NaNs that the
    analyses handle, and the warnings would only break the CLI's one-line contract."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _extract_ranks(
    groups: list[list[TraceFileRef]], analyses: Sequence[Analysis[Any]], jobs: int, use_cache: bool, progress: Progress
) -> tuple[list[RankExtracts], list[InputError]]:
    """Extracts of the ranks that could be read, and the input errors of those that could not."""
    total = len(groups)
    done = ByteProgress(progress, groups)
    if jobs <= 1 or total <= 1:  # one rank: its large files are parsed on `jobs` threads instead

        def serial(i: int) -> RankExtracts:
            return extract_rank(groups[i], analyses, use_cache, i, parse_jobs=jobs, on_bytes=done.parsed)

        return _collect(serial, total, done.rank_done)
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    try:
        with process_pool(min(jobs, total)) as pool:
            futures = [pool.submit(_extract_rank_quietly, group, analyses, use_cache, i) for i, group in enumerate(groups)]
            index_of = {future: i for i, future in enumerate(futures)}
            for future in as_completed(futures):
                done.rank_done(index_of[future])
            return _collect(lambda i: futures[i].result(), total, _no_rank_done)
    except BrokenProcessPool:
        raise TorchscopeError(
            "a worker process died while analysing the ranks (out of memory?); retry with --jobs 1"
        ) from None


def _cluster_ranks(
    groups: list[list[TraceFileRef]], analyses: Sequence[Analysis[Any]], jobs: int, use_cache: bool, address: str
) -> tuple[list[RankExtracts], list[InputError]]:
    """As `_extract_ranks`, each rank a task on a Dask cluster (a local one of `jobs` workers for "local")."""
    from torchscope.pipeline.cluster import extract_on_cluster

    results = extract_on_cluster(groups, analyses, use_cache, address, jobs)

    def result_of(index: int) -> RankExtracts:
        value = results[index]
        if isinstance(value, InputError):
            raise value
        return value

    return _collect(result_of, len(results), _no_rank_done)


def _no_rank_done(index: int) -> None:
    return None


def _extract_rank_quietly(refs: list[TraceFileRef], analyses: Sequence[Analysis[Any]], use_cache: bool, rank_fallback: int) -> RankExtracts:
    with quiet_numerics():
        return extract_rank(refs, analyses, use_cache, rank_fallback)


def _collect(
    result_of: Callable[[int], RankExtracts], count: int, rank_done: Callable[[int], None]
) -> tuple[list[RankExtracts], list[InputError]]:
    results: list[RankExtracts] = []
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
