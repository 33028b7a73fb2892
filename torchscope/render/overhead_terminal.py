"""The terminal report's "without the profiler" table: each host phase's share as recorded and as the
training runs unprofiled (measurements.profiler_overhead, computed by analysis/overhead.py). It only
presents those figures."""

from __future__ import annotations

from rich import box
from rich.table import Table

from torchscope.render.units import duration
from torchscope.report.model import Report

MEASURED = {"fetch_clock": "fetch times of unprofiled steps", "step_clock": "unprofiled step times"}


def overhead_table(report: Report) -> Table | None:
    """Recorded vs unprofiled share per phase, with the phase's slowdown; None when not measured."""
    section = report.measurements.profiler_overhead
    if section.method not in MEASURED or not section.corrected_percent:
        return None
    slowdown = section.profiled_step_us / section.unprofiled_step_us if section.unprofiled_step_us > 0 else 0.0
    table = Table(
        title=f"Without the profiler's overhead (capture clock: {MEASURED[section.method]}; recorded steps "
        f"{slowdown:.2f}x the unprofiled {duration(section.unprofiled_step_us)})",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    table.add_column("phase")
    table.add_column("recorded %", justify="right")
    table.add_column("unprofiled %", justify="right")
    table.add_column("slowdown", justify="right")
    for name, percent in section.corrected_percent.items():
        recorded = report.phases.get(name)
        if recorded is None or (recorded.percent <= 0 and percent <= 0):
            continue
        factor = section.slowdown_by_phase.get(name)
        table.add_row(name, f"{recorded.percent:.1f}", f"{percent:.1f}", f"{factor:.2f}x" if factor else "-")
    return table
