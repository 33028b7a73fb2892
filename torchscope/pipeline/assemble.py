"""Assembly: the ranks' extracts reduced, analysis by analysis, into one Report (before diagnosis)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from torchscope import __version__
from torchscope.analysis.registry import Analysis, Part, SpanKey
from torchscope.pipeline.rank_extracts import RankExtracts
from torchscope.report.measurements import Measurements
from torchscope.report.model import Report, RunInfo
from torchscope.text import path_text

_DONE_STATUSES = (None, "complete", "stopped")


def assemble(
    ranks: list[RankExtracts],
    analyses: Sequence[Analysis[Any]],
    manifest: dict[str, Any],
    manifest_statuses: list[str | None],
    paths: list[str],
) -> tuple[Report, dict[str, Any]]:
    """The Report of a run and its sidecars: `analyses[0]` is the span metadata, each other analysis
    fills its fields (or its sidecars)."""
    ranks = sorted(ranks, key=lambda r: (r.rank, r.worker))
    keyed = [(_key(rank, index, span.meta), span) for rank in ranks for index, span in enumerate(rank.spans)]
    fields: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    sidecars: dict[str, Any] = {}
    for analysis in analyses[1:]:
        parts = [Part(key=key, value=span.values[analysis.name]) for key, span in keyed]
        for target, value in analysis.reduce(parts).items():
            if target not in analysis.targets():
                raise ValueError(f"analysis {analysis.name!r} filled {target!r}, which it does not declare")
            group, _, name = target.partition(".")
            if analysis.sidecar:
                sidecars[target] = value
            elif group == "extra":
                extra[name] = value
            elif group == "measurements":
                sections[name] = value
            else:
                fields[target] = value
    metas = [span.meta for _, span in keyed]
    kinds = {meta.device_kind for meta in metas}
    report = Report(
        torchscope_version=__version__,
        run=RunInfo(
            paths=paths,
            trace_files=[path_text(_relative_to_input(meta.file, paths)) for meta in metas],
            ranks=sorted({r.rank for r in ranks}),
            device_kind=next((k for k in ("cuda", "rocm") if k in kinds), "cpu"),
            step_source=metas[0].step_source if metas else "profiler_step",
            manifest=manifest,
            partial=any(meta.warnings for meta in metas) or any(s not in _DONE_STATUSES for s in manifest_statuses),
        ),
        measurements=Measurements(**sections),
        warnings=[f"{path_text(Path(meta.file).name)}: {w}" for meta in metas for w in meta.warnings],
        extra=extra,
        **fields,
    )
    return report, sidecars


def _relative_to_input(file: str, paths: list[str]) -> str:
    """`file` relative to the folder it was found in (the run directory given), or its name when it was
    given itself: the same text wherever the analysis runs from, cache or not."""
    target = Path(file).absolute()
    for given in paths:
        folder = Path(given).absolute()
        if target == folder:
            return target.name
        if target.is_relative_to(folder):
            return target.relative_to(folder).as_posix()
    return target.name


def _key(rank: RankExtracts, index: int, meta: Any) -> SpanKey:
    return SpanKey(
        rank=rank.rank,
        worker=rank.worker,
        file=meta.file,
        span=index,
        steps=meta.steps,
        step_us=meta.step_us,
        has_device=meta.has_device,
    )
