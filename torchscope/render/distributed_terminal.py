"""The terminal report's across-ranks section: ranks side by side (phases, time in collectives split
into waiting and transfer, lateness, overlap), or, beyond a screenful of ranks, min / median / max per
metric with the worst ranks named. It only presents `Report.distributed`."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchscope.render.units import duration
from torchscope.report.distributed import Distributed, RankDistributed
from torchscope.text import printable

MAX_RANK_ROWS = 16  # beyond this, the summary per metric instead of one row per rank
MAX_STEP_COLUMNS = 10  # per-step overlap: the first steps only, so the table fits a terminal
_PHASES = (("data_loading", "data"), ("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"), ("other", "outside"))
_STAT_LABELS = {
    "step_us": "step",
    "comm_us_per_step": "in collectives",
    "wait_us_per_step": "waiting",
    "exposed_transfer_us_per_step": "exposed transfer",
    "lateness_us_per_step": "lateness",
    "comm_compute_overlap_pct": "comm/compute overlap %",
    "idle_pct": "device idle %",
}


def distributed_section(section: Distributed) -> Group | None:
    """The section, or None when the run has no collectives across ranks."""
    if not section.present or not section.ranks:
        return None
    blocks: list[Any] = [_headline(section)]
    if len(section.ranks) <= MAX_RANK_ROWS:
        blocks.append(_per_rank(section))
        device = _device_time(section)
        if device is not None:
            blocks.append(device)
    else:
        blocks.append(_summary(section))
    return Group(*blocks)


def _headline(section: Distributed) -> Text:
    if not section.matched:
        in_collectives = sum(r.comm_us_per_step for r in section.ranks) / max(len(section.ranks), 1)
        return Text(printable(
            f"Across ranks: {section.world_size} rank(s), no collective seen on two ranks; {duration(in_collectives)} per step "
            "in collectives (waiting cannot be told from transfer without the other ranks' traces)"
        ))
    how = {"sequence": "by sequence number", "order": "by order of occurrence (no sequence numbers)", "none": "-"}
    line = (
        f"Across ranks: {section.world_size} rank(s), {section.matched} collective(s) matched {how[section.match_method]}; "
        f"per step {duration(section.wait_us_per_step)} waiting, {duration(section.transfer_us_per_step)} transfer "
        f"({duration(section.exposed_transfer_us_per_step)} not overlapped with compute)"
    )
    return Text(printable(line))


def _per_rank(section: Distributed) -> Table:
    table = Table(title="Ranks side by side (ms per step)", box=box.SIMPLE_HEAD, title_justify="left", padding=(0, 1), pad_edge=False)
    columns = ["rank", "step", *(label for _, label in _PHASES), "coll", "wait", "xfer", "late"]
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    late_rank = section.straggler.rank if section.straggler else None
    for row in section.ranks:
        cells = [str(row.rank) + ("*" if row.rank == late_rank else ""), _ms(row.step_us)]
        cells += [_ms(row.phases_us_per_step.get(phase, 0.0)) for phase, _ in _PHASES]
        cells += [_ms(row.comm_us_per_step), _ms(row.wait_us_per_step), _ms(row.transfer_us_per_step), _late(row)]
        table.add_row(*cells)
    table.caption = (
        "coll: in collectives = wait (for the last rank) + xfer (transfer: the shortest instance across ranks); "
        "late: arrives after the median other rank" + ("; * the rank the others wait for" if late_rank is not None else "")
    )
    table.caption_justify = "left"
    return table


def _device_time(section: Distributed) -> Table | None:
    """GPU traces: each rank's idle / compute / non-compute share of the device's traced time, and the share
    of its communication overlapped by compute over the run and in each step (the first MAX_STEP_COLUMNS)."""
    if not any(r.comm_compute_overlap_pct is not None or r.compute_pct is not None for r in section.ranks):
        return None
    steps = sorted({step for r in section.ranks for step in r.overlap_pct_by_step}, key=_step_order)
    shown = steps[:MAX_STEP_COLUMNS]
    table = Table(title="Device time per rank (%)", box=box.SIMPLE_HEAD, title_justify="left", padding=(0, 1), pad_edge=False)
    for column in ["rank", "idle", "compute", "non-compute", "overlap", *(f"#{step}" for step in shown)]:
        table.add_column(column, justify="right", no_wrap=True)
    for row in section.ranks:
        table.add_row(str(row.rank), _pct(row.idle_pct), _pct(row.compute_pct), _pct(row.non_compute_pct),
                      _pct(row.comm_compute_overlap_pct), *(_pct(row.overlap_pct_by_step.get(step)) for step in shown))
    caption = "idle / compute / non-compute: of the device's traced time; overlap: of the rank's communication, overlapped by compute"
    if shown:
        caption += "; #N: the same in step N"
    if len(steps) > len(shown):
        caption += f" ({len(steps) - len(shown)} more step(s) in the JSON report)"
    table.caption, table.caption_justify = caption, "left"
    return table


def _step_order(step: str) -> tuple[int, str]:
    return (int(step), "") if step.lstrip("-").isdigit() else (1 << 62, step)


def _summary(section: Distributed) -> Table:
    table = Table(title=f"{len(section.ranks)} ranks (per step; min / median / max)", box=box.SIMPLE_HEAD, title_justify="left")
    for column, justify in (("metric", "left"), ("min", "right"), ("median", "right"), ("max", "right"), ("highest ranks", "left")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for stat in section.stats:
        show = _pct if stat.metric.endswith("_pct") else duration
        table.add_row(_STAT_LABELS.get(stat.metric, stat.metric), show(stat.min), show(stat.median), show(stat.max),
                      ", ".join(str(r) for r in stat.worst_ranks))  # fmt: skip
    return table


def _ms(us: float) -> str:
    return f"{us / 1000:,.0f}" if abs(us) >= 100_000 else f"{us / 1000:,.1f}"


def _late(row: RankDistributed) -> str:
    return _ms(row.lateness_us_per_step) if row.lateness_us_per_step > 0 else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
