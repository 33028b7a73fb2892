"""Cross-rank analysis: per-rank step time and communication, and (the `distributed` analysis) collectives
matched across ranks, waiting vs transfer, and the straggler with why it is late (docs/distributed.md).

Communication time is the per-step "communication" category of the breakdown; compute is kernel time
(device traces) or forward+backward+optimizer (CPU traces). A rank whose collectives are short while the
others' are long is the one the others wait for (the TensorBoard plugin's "real transfer = minimum over
ranks, the rest is synchronising" view).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchscope.analysis.collective_match import CollectiveTable, collective_table
from torchscope.analysis.collectives import RankCollectives, extract_collectives
from torchscope.analysis.registry import Analysis, Part, SpanKey
from torchscope.analysis.straggler import lateness, per_step_phases, straggler
from torchscope.arrays import distinct, median
from torchscope.report.distributed import CollectiveSummary, Distributed, RankDistributed, RankStat
from torchscope.report.model import RankSummary, StepRow
from torchscope.text import path_text


def rank_summaries(spans: list[tuple[SpanKey, list[StepRow]]]) -> list[RankSummary]:
    """One summary per worker (its spans in order), in the order the workers first appear."""
    workers: dict[tuple[int, str], list[tuple[SpanKey, list[StepRow]]]] = {}
    for key, rows in spans:
        workers.setdefault((key.rank, key.worker), []).append((key, rows))
    return [_summary(rank, worker, mine) for (rank, worker), mine in workers.items()]


def _summary(rank: int, worker: str, spans: list[tuple[SpanKey, list[StepRow]]]) -> RankSummary:
    steps = [row for _, rows in spans for row in rows]
    has_device = any(key.has_device for key, _ in spans)
    durations = np.array([s.duration_us for s in steps]) if steps else np.zeros(1)
    keys = {k for s in steps for k in s.breakdown}
    breakdown = {k: float(np.mean([s.breakdown.get(k, 0.0) for s in steps])) for k in sorted(keys)}
    phases = {k: float(np.mean([s.phases.get(k, 0.0) for s in steps])) for k in ("forward", "backward", "optimizer")} if steps else {}
    compute = breakdown.get("kernel") if has_device else sum(phases.values())
    return RankSummary(
        rank=rank,
        worker=worker,
        files=[path_text(key.file) for key, _ in spans],  # JSON-safe: a path may hold undecodable bytes
        steps=len(steps),
        mean_step_us=float(durations.mean()),
        median_step_us=float(median(durations)),
        breakdown_us=breakdown,
        comm_us_per_step=breakdown.get("communication", 0.0),
        compute_us_per_step=float(compute or 0.0),
    )


# --- Collectives across ranks (issue 17): matched instances, clocks, waiting vs transfer, the straggler.


def reduce_distributed(parts: list[Part[RankCollectives]]) -> dict[str, Any]:
    """Match every rank's collective instances, then derive waiting, transfer, lateness and the straggler."""
    by_rank: dict[int, list[RankCollectives]] = {}
    for part in parts:
        by_rank.setdefault(part.key.rank, []).append(part.value)
    if not any(p.value.name_id or p.value.device is not None for p in parts):
        return {"distributed": Distributed()}
    ranks = sorted(by_rank)
    table = collective_table(ranks, [by_rank[r] for r in ranks])
    return {"distributed": summarise(ranks, [by_rank[r] for r in ranks], table)}


DISTRIBUTED = Analysis(
    name="distributed",
    extract=extract_collectives,
    extract_type=RankCollectives,
    reduce=reduce_distributed,
    fills=("distributed",),
)


def summarise(ranks: list[int], extracts: list[list[RankCollectives]], table: CollectiveTable) -> Distributed:
    """The Report's `distributed` section from the matched table."""
    steps, late, step_rows = lateness(table, ranks)
    phases = [per_step_phases(spans) for spans in extracts]
    rows = [_rank_row(i, rank, extracts[i], table, late, phases[i]) for i, rank in enumerate(ranks)]
    matched = table.matched
    notes = []
    if table.method == "order":
        notes.append("No sequence numbers in the traces: collectives matched by step, process group, name and order of occurrence.")
    if (~matched).any():
        notes.append(f"{int((~matched).sum())} collective instance(s) seen on one rank only: counted as transfer.")
    return Distributed(
        present=True,
        world_size=len(ranks),
        source=table.source,
        match_method=table.method,  # type: ignore[arg-type]  # one of MatchMethod by construction
        matched=int((table.ranks_per_key >= 2).sum()),
        unmatched=int((~matched).sum()),
        wait_us_per_step=_mean([r.wait_us_per_step for r in rows]),
        transfer_us_per_step=_mean([r.transfer_us_per_step for r in rows]),
        exposed_transfer_us_per_step=_mean([r.exposed_transfer_us_per_step for r in rows]),
        ranks=rows,
        steps=step_rows,
        straggler=straggler(ranks, extracts, steps, late, phases),
        collectives=_collectives(table),
        stats=_stats(rows),
        notes=notes,
    )


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _rank_row(index: int, rank: int, spans: list[RankCollectives], table: CollectiveTable, late: np.ndarray, phases: dict[str, float]) -> RankDistributed:
    steps = sum(len(s.step_numbers) for s in spans)
    mine = (table.rank == index) & (table.step >= 0)
    per_step = 1.0 / steps if steps else 0.0
    dur = table.dur_us[mine]
    weight = table.weight[mine]  # per-step totals are wall time: concurrent instances share it
    exposed = table.transfer_us[mine] * (1.0 - np.divide(table.overlap_us[mine], dur, out=np.zeros_like(dur), where=dur > 0))
    row = RankDistributed(
        rank=rank,
        steps=steps,
        step_us=float(sum(sum(s.step_us) for s in spans) * per_step),
        comm_us_per_step=float((dur * weight).sum() * per_step),
        wait_us_per_step=float((table.wait_us[mine] * weight).sum() * per_step),
        transfer_us_per_step=float((table.transfer_us[mine] * weight).sum() * per_step),
        exposed_transfer_us_per_step=float((np.maximum(exposed, 0.0) * weight).sum() * per_step),
        lateness_us_per_step=float(np.nanmean(late[index])) if late.size and not np.isnan(late[index]).all() else 0.0,
        clock_offset_us=float(table.clock_offset_us[index]) if table.clock_offset_us.size else 0.0,
        phases_us_per_step=phases,
    )
    _device_percentages(row, spans)
    return row


def _device_percentages(row: RankDistributed, spans: list[RankCollectives]) -> None:
    """HTA's temporal breakdown and communication-computation overlap, over the rank's whole traces."""
    devices = [s.device for s in spans if s.device is not None]
    span_us = sum(d.span_us for d in devices)
    if not devices or span_us <= 0:
        return
    busy, compute = sum(d.busy_us for d in devices), sum(d.compute_us for d in devices)
    comm, overlap = sum(d.comm_us for d in devices), sum(d.overlap_us for d in devices)
    row.idle_pct = 100.0 * (span_us - busy) / span_us
    row.compute_pct = 100.0 * compute / span_us
    row.non_compute_pct = 100.0 * (busy - compute) / span_us
    row.comm_compute_overlap_pct = 100.0 * overlap / comm if comm > 0 else None
    for span in spans:
        device = span.device
        for step, comm_us, overlap_us in zip(span.step_numbers, device.step_comm_us if device else [], device.step_overlap_us if device else []):
            if comm_us > 0:
                row.overlap_pct_by_step[str(step)] = 100.0 * overlap_us / comm_us


def _collectives(table: CollectiveTable, top: int = 20) -> list[CollectiveSummary]:
    """Per (group, collective): matched calls, mean transfer and mean wait per rank and instance."""
    if table.key.size == 0:
        return []
    labels = np.array([f"{g}\x00{n}" for g, n in zip(table.key_group, table.key_name)], dtype=object)
    label_of_instance = labels[table.key]
    out = []
    for label in distinct(labels).tolist():  # arrays.distinct: np.unique imports numpy.ma
        mine = label_of_instance == label
        keys = distinct(table.key[mine])
        group, name = label.split("\x00", 1)
        out.append(CollectiveSummary(
            name=name,
            group=group,
            calls=int(keys.size),
            ranks=int(table.ranks_per_key[keys].max()),
            mean_transfer_us=float(table.transfer_us[mine].mean()),
            mean_wait_us=float(table.wait_us[mine].mean()),
            mean_nelems=float(np.maximum(table.nelems[mine], 0).mean()),
        ))
    out.sort(key=lambda c: -(c.mean_transfer_us + c.mean_wait_us) * c.calls)
    return out[:top]


STAT_METRICS = ("step_us", "comm_us_per_step", "wait_us_per_step", "exposed_transfer_us_per_step", "lateness_us_per_step")


def _stats(rows: list[RankDistributed], worst: int = 3) -> list[RankStat]:
    """min / median / max of each per-rank metric, and the ranks with the highest values."""
    out = []
    for metric in (*STAT_METRICS, "comm_compute_overlap_pct", "idle_pct"):
        values = [(getattr(r, metric), r.rank) for r in rows if getattr(r, metric) is not None]
        if not values:
            continue
        numbers = np.array([v for v, _ in values], dtype=np.float64)
        order = np.argsort(-numbers, kind="stable")[:worst]
        out.append(RankStat(
            metric=metric,
            min=float(numbers.min()),
            median=median(numbers),  # arrays.median: np.median imports numpy.ma
            max=float(numbers.max()),
            worst_ranks=[values[i][1] for i in order.tolist()],
        ))
    return out
