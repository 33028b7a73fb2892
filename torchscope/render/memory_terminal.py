"""The terminal report's memory section: one row per device (peak, when and where, growth and churn
per step) and what is alive at the peak, by call site. It only presents `Report.memory`."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from torchscope.render.units import size
from torchscope.report.model import MemoryGrowth, MemorySummary
from torchscope.text import printable

ALIVE_ROWS = 3


def memory_table(memory: MemorySummary) -> Group | None:
    """The memory section, or None when the trace has no memory events."""
    if not memory.present or not memory.peak_allocated_bytes:
        return None
    table = Table(title="Memory (per device; blocks paired by address)" if memory.has_addresses else "Memory (per device)",
                  box=box.SIMPLE_HEAD, title_justify="left")  # fmt: skip
    for name, justify in (("device", "left"), ("peak alloc.", "right"), ("reserved", "right"), ("growth/step", "right"),
                          ("temporaries/step", "right"), ("at the peak", "left")):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    churn = _temporaries_per_step(memory)
    for device, peak_bytes in memory.peak_allocated_bytes.items():
        peak = memory.peaks.get(device)
        reserved = memory.peak_reserved_bytes.get(device)
        fit = memory.growth.get(device)
        where = ""
        if peak is not None:
            step = f"step {peak.step}" if peak.step is not None else "outside steps"
            where = ", ".join(p for p in (step, peak.phase, peak.operator) if p)
        table.add_row(
            Text(printable(device)), size(peak_bytes), size(reserved) if reserved else "-",
            _growth(fit) if fit and fit.boundaries >= 3 else "-",
            size(churn[device]) if device in churn else "-", Text(printable(where)),
        )  # fmt: skip
    return Group(table, *filter(None, (_alive(device, memory) for device in memory.peak_allocated_bytes)))


def _growth(fit: MemoryGrowth) -> str:
    """The slope and its fit, and the line the leak rule judges where blocks perhaps freed unseen were taken
    off it (the allocator counts only recorded events)."""
    doubted = fit.doubtful_bytes_per_step > 0 and abs(fit.leak_bytes_per_step - fit.bytes_per_step) >= 0.01 * abs(fit.bytes_per_step)
    return f"{size(fit.bytes_per_step)} (R² {fit.r2:.2f})" + (f"; {size(fit.leak_bytes_per_step)} without blocks maybe freed unseen" if doubted else "")


def _alive(device: str, memory: MemorySummary) -> Table | None:
    """The call sites whose blocks are alive at the device's peak, largest first."""
    peak = memory.peaks.get(device)
    if peak is None or not peak.alive_by_call_site:
        return None
    table = Table(title=printable(f"Alive at the {device} peak, by call site"), box=None, title_justify="left", padding=(0, 2))
    table.add_column("bytes", justify="right")
    table.add_column("call site", overflow="fold")
    for site, alive in list(peak.alive_by_call_site.items())[:ALIVE_ROWS]:
        table.add_row(size(alive), Text(printable(site)))
    return table


def _temporaries_per_step(memory: MemorySummary) -> dict[str, float]:
    if not memory.has_addresses:
        return {}
    totals: dict[str, list[int]] = {}
    for row in memory.per_step:
        totals.setdefault(row.device, []).append(row.temporary_bytes)
    return {device: sum(values) / len(values) for device, values in totals.items() if values}
