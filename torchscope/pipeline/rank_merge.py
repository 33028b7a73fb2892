"""Which trace files are one rank, and which of a rank's spans are its training.

Discovery groups files by the worker name in their file names (`tensorboard_trace_handler`'s
`<worker>.<timestamp>.pt.trace.json`), but one process can write files under several names: Lightning's
`PyTorchProfiler` names each file after the action it recorded (`fit-...training_step.<ts>...`,
`fit-...validation_step.<ts>...`), and all ranks can write under one name (Lightning's names carry the
local rank only). Files are one rank when their headers give the same `distributedInfo.rank`, else the
same `rank<N>` in their names, else the same process (the host ops' pid and the header's `host_name`)
whose files never overlap in time: two workers of one process read as two ranks gave a straggler finding
between a training loop and its own validation loop.

A rank's spans whose steps hold no backward and no optimizer step but an evaluation action (Lightning's
validation_step ranges: analysis/step_kinds.py), beside spans of the same rank that train, are evaluation:
they are left out,
with a warning, so that their steps do not mix into the training steps' figures. A run that only
evaluates keeps all its spans. Inside a span, evaluation steps beside training steps are left out of the
step windows already (analysis/step_kinds.py); here they only get their warning.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import msgspec

from torchscope.pipeline.rank_extracts import RankExtracts, SpanExtracts
from torchscope.text import path_text


def merge_same_rank(ranks: list[RankExtracts]) -> tuple[list[RankExtracts], list[str]]:
    """The ranks, split where one worker name holds several header ranks and merged where several worker
    names are one rank (see the module docstring), their spans in capture order and the worker name of
    the earliest; ranks numbered by their order alone take the lowest numbers no other rank has. With a
    warning per rank whose files come from more than one process (two runs in one folder?)."""
    parts = sorted((part for rank in ranks for part in _split_by_header_rank(rank)), key=lambda r: r.spans[0].meta.first_ts_us)
    merged: list[RankExtracts] = []
    for rank in parts:
        into = next((i for i, other in enumerate(merged) if _same_rank(other, rank)), None)
        if into is None:
            merged.append(rank)
            continue
        first = merged[into]
        spans = sorted(first.spans + rank.spans, key=lambda span: span.meta.first_ts_us)
        merged[into] = RankExtracts(rank=min(first.rank, rank.rank), worker=first.worker, spans=spans, rank_known=first.rank_known)
    taken = {r.rank for r in merged if r.rank_known}
    free = (n for n in itertools.count() if n not in taken)
    for rank in sorted((r for r in merged if not r.rank_known), key=lambda r: r.rank):
        rank.rank = next(free)
    return merged, [warning for rank in merged if (warning := _processes_warning(rank))]


def _split_by_header_rank(rank: RankExtracts) -> list[RankExtracts]:
    """One rank per header rank among the worker's files (all ranks may write under one worker name:
    Lightning's file names carry the local rank only); files without a header rank join the only one
    there is, else form a rank of their own (numbered later)."""
    numbers = sorted({span.meta.header_rank for span in rank.spans if span.meta.header_rank is not None})
    if len(numbers) <= 1:
        return [rank]
    groups: dict[int | None, list[SpanExtracts]] = {}
    for span in rank.spans:
        groups.setdefault(span.meta.header_rank, []).append(span)
    return [
        RankExtracts(rank=-1 if number is None else number, worker=rank.worker, spans=spans, rank_known=number is not None)
        for number, spans in groups.items()
    ]


def _same_rank(a: RankExtracts, b: RankExtracts) -> bool:
    """Known ranks: the same number. Others: the same process (pid, and host where both traces name it),
    whose files never overlap in time (one process's profiler windows follow each other; ranks on two
    nodes can share a pid, one container each, and run at the same time)."""
    if a.rank_known or b.rank_known:
        return a.rank_known and b.rank_known and a.rank == b.rank
    (pid_a, host_a), (pid_b, host_b) = _process(a), _process(b)
    if pid_a is None or pid_a != pid_b or (host_a is not None and host_b is not None and host_a != host_b):
        return False
    return not any(x.meta.first_ts_us < y.meta.last_ts_us and y.meta.first_ts_us < x.meta.last_ts_us for x in a.spans for y in b.spans)


def _process(rank: RankExtracts) -> tuple[str | None, str | None]:
    metas = [span.meta for span in rank.spans]
    return next((m.pid for m in metas if m.pid is not None), None), next((m.host for m in metas if m.host is not None), None)


def _processes_warning(rank: RankExtracts) -> str:
    """A warning when the rank's files come from more than one process, else ""."""
    processes = sorted({(m.host or "", m.pid) for m in (span.meta for span in rank.spans) if m.pid is not None})
    if len(processes) < 2:
        return ""
    pids = ", ".join(pid for _, pid in processes if pid is not None)
    return (f"rank {rank.rank} ({rank.worker}): its trace files come from {len(processes)} processes (pid {pids}), "
            "read as one rank; if they are separate runs, analyse each run's files apart")  # fmt: skip


def training_spans(rank: RankExtracts) -> tuple[RankExtracts, list[str]]:
    """The rank with only its training spans where it has both kinds, and a warning per span left out and
    per span whose evaluation steps were left out (analysis/step_kinds.py)."""
    trains = [span.meta.trains for span in rank.spans]
    both = not all(trains) and any(trains)
    warnings = []
    for span, train in zip(rank.spans, trains):
        name = path_text(Path(span.meta.file).name)
        if both and not train:
            warnings.append(f"{name}: {span.meta.steps} evaluation step(s) (no backward pass or optimizer step), beside "
                            "training steps of the same rank: left out")  # fmt: skip
        elif span.meta.evaluation_steps:
            warnings.append(f"{name}: {span.meta.evaluation_steps} evaluation step(s) (no backward pass or optimizer "
                            f"step; {span.meta.evaluation_us / 1000:.1f} ms in all), beside training steps: "
                            "left out of the step figures")  # fmt: skip
    if not both:
        return rank, warnings
    return msgspec.structs.replace(rank, spans=[span for span, train in zip(rank.spans, trains) if train]), warnings
