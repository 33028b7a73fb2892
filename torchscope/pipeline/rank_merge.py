"""Which trace files are one rank, and which of a rank's spans are its training.

Discovery groups files by the worker name in their file names (`tensorboard_trace_handler`'s
`<worker>.<timestamp>.pt.trace.json`), but one process can write files under several names: Lightning's
`PyTorchProfiler` names each file after the action it recorded (`fit-...training_step.<ts>...`,
`fit-...validation_step.<ts>...`). Files are one rank when their headers give the same
`distributedInfo.rank`, else the same `rank<N>` in their names, else the same process (the host ops' pid
and the header's `host_name`): two workers of one process read as two ranks gave a straggler finding
between a training loop and its own validation loop.

A rank's spans whose steps hold no backward and no optimizer step, beside spans of the same rank whose
steps do, are evaluation (Lightning records validation batches as profiler steps too): they are left out,
with a warning, so that their steps do not mix into the training steps' figures. A run that only
evaluates keeps all its spans. Inside a span, evaluation steps beside training steps are left out of the
step windows already (analysis/step_kinds.py); here they only get their warning.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from torchscope.pipeline.rank_extracts import RankExtracts
from torchscope.text import path_text


def merge_same_rank(ranks: list[RankExtracts]) -> list[RankExtracts]:
    """The ranks, those that are one rank (see the module docstring) merged, their spans in capture order
    and the worker name of the earliest; ranks numbered by their order alone are numbered again 0..n-1."""
    merged: dict[tuple[object, ...], RankExtracts] = {}
    for rank in ranks:
        key = _identity(rank)
        if key in merged:
            first = merged[key]
            spans = sorted(first.spans + rank.spans, key=lambda span: span.meta.first_ts_us)
            earliest = first if first.spans[0] is spans[0] else rank
            merged[key] = RankExtracts(rank=min(first.rank, rank.rank), worker=earliest.worker, spans=spans, rank_known=first.rank_known)
        else:
            merged[key] = rank
    out = list(merged.values())
    if len(out) < len(ranks):
        unknown = sorted((r for r in out if not r.rank_known), key=lambda r: r.rank)
        for number, rank in enumerate(unknown):
            rank.rank = number
    return out


def _identity(rank: RankExtracts) -> tuple[object, ...]:
    if rank.rank_known:
        return ("rank", rank.rank)
    metas = [span.meta for span in rank.spans]
    pid = next((meta.pid for meta in metas if meta.pid is not None), None)
    if pid is None:
        return ("worker", rank.worker)
    return ("process", next((meta.host for meta in metas if meta.host is not None), None), pid)


def training_spans(rank: RankExtracts) -> tuple[RankExtracts, list[str]]:
    """The rank with only its training spans where it has both kinds, and a warning per span left out and
    per span whose evaluation steps were left out (analysis/step_kinds.py)."""
    trains = [span.meta.trains for span in rank.spans]
    both = not all(trains) and any(trains)
    warnings = []
    for span, train in zip(rank.spans, trains):
        name = path_text(Path(span.meta.file).name)
        if both and not train:
            warnings.append(f"{name}: {span.meta.steps} step(s) without a backward pass or an optimizer step, beside "
                            "training steps of the same rank (evaluation): left out")  # fmt: skip
        elif span.meta.evaluation_steps:
            warnings.append(f"{name}: {span.meta.evaluation_steps} step(s) without a backward pass or an optimizer "
                            f"step ({span.meta.evaluation_us / 1000:.1f} ms in all), beside training steps (evaluation): "
                            "left out of the step figures")  # fmt: skip
    if not both:
        return rank, warnings
    return msgspec.structs.replace(rank, spans=[span for span, train in zip(rank.spans, trains) if train]), warnings
