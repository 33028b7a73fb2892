"""The terminal report's call-site table: where the top operators are called from in the user's code.
It only presents `Report.call_sites` (analysis/callsites.py). From `STACK_WIDTH` columns on, where the rows
carry call stacks, a "called by" column lists the user's frames above the site, nearest caller first (cut
at its end when long): narrower terminals keep the table as it was, the HTML report shows every stack."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from torchscope.render.fit import fit_names
from torchscope.render.units import duration
from torchscope.report.model import Report
from torchscope.text import printable

STACK_WIDTH = 120  # the "called by" column only where the operator and site columns keep their room


def call_sites_table(report: Report, top: int, width: int = 100) -> Table | None:
    """The top operators' call sites (the operator named once, on its first site), or None without stacks."""
    if not report.call_sites:
        return None
    device = report.device.present
    callers = width >= STACK_WIDTH and any(len(row.stack) > 1 for row in report.call_sites)
    table = Table(title="Call sites of the top operators (totals over the whole trace)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for column in ("operator", "called from", *(("called by",) if callers else ()), "calls", "host self",
                   *(("device self",) if device else ())):
        table.add_column(column, justify="left" if column in ("operator", "called from", "called by") else "right",
                         overflow="ellipsis", no_wrap=True)
    previous = None
    shown = 0
    for row in report.call_sites:
        if row.operator != previous:
            shown += 1
            if shown > top:
                break
        by = " < ".join(reversed(row.stack[:-1])) or "-"  # nearest caller first: what a cut keeps
        cells = ["" if row.operator == previous else row.operator, row.site, *((by,) if callers else ()), f"{row.calls:,}",
                 duration(row.host_self_us), *((duration(row.device_self_us),) if device else ())]
        table.add_row(*(Text(printable(cell)) for cell in cells))
        previous = row.operator
    return fit_names(table, width, {"operator": 1, "called from": 2, **({"called by": 2} if callers else {})})
