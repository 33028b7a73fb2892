"""`torchscope memory SNAPSHOT.pickle` in the terminal: per device, the allocator now and over the
recorded history, and the call sites holding memory. It only presents a `SnapshotSummary`."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchscope.render.units import size
from torchscope.report.snapshot import SnapshotDevice, SnapshotSite, SnapshotSummary
from torchscope.text import printable

SITE_ROWS = 5


def render_snapshot(summary: SnapshotSummary, width: int | None = None) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or 100, force_terminal=False, color_system=None, highlight=False, soft_wrap=False)
    console.print(Text(printable(f"torchscope memory  {summary.path}"), style="bold"))
    if not summary.devices:
        console.print("The snapshot holds no segments and no history (was CUDA used?).")
    for device in summary.devices:
        console.print(_device(device))
        for title, sites in (("Allocated now, by call site", device.top_sites), ("Alive at the peak of the history, by call site", device.peak_sites)):
            table = _sites(title, sites)
            if table is not None:
                console.print(table)
    for warning in summary.warnings:
        console.print(Text(printable(f"warning: {warning}")))
    return buffer.getvalue()


def _device(d: SnapshotDevice) -> Table:
    table = Table(title=f"cuda:{d.device}", box=box.SIMPLE_HEAD, title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("reserved (segments)", f"{size(d.reserved_bytes)} in {d.segments} segment(s)" + (", expandable" if d.expandable_segments else "")),
        ("allocated", f"{size(d.allocated_bytes)} (requested {size(d.requested_bytes)})"),
        ("cached free", f"{size(d.inactive_bytes)}, largest block {size(d.largest_inactive_bytes)}"),
        ("fragmentation of the free memory", f"{100 * d.fragmentation:.0f}%"),
    ]
    if d.peak_allocated_bytes is not None:
        rows += [
            ("history", f"{d.history_entries} allocator actions"),
            ("peak allocated in the history", size(d.peak_allocated_bytes)),
            ("cudaMalloc / cudaFree in the history", f"{d.segment_allocs} / {d.segment_frees}"),
        ]
        if d.ooms:
            rows.append(("out-of-memory errors", str(d.ooms)))
    for what, value in rows:
        table.add_row(what, value)
    return table


def _sites(title: str, sites: list[SnapshotSite]) -> Table | None:
    if not sites:
        return None
    table = Table(title=title, box=None, title_justify="left", padding=(0, 2))
    table.add_column("bytes", justify="right")
    table.add_column("blocks", justify="right")
    table.add_column("call site", overflow="fold")
    for site in sites[:SITE_ROWS]:
        table.add_row(size(site.bytes), str(site.blocks), Text(printable(site.site)))
    return table
