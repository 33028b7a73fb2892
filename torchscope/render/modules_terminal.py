"""The terminal report's per-module table: time per ``nn.Module`` path, largest first. It only presents
`Report.modules` (analysis/modules.py)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from torchscope.render.units import duration
from torchscope.report.model import Report
from torchscope.text import printable

PATH_WIDTH = 48


def short_path(path: str, width: int = PATH_WIDTH) -> str:
    """The end of a long module path (the module itself is what matters): ``…/Block_3/Linear_7``."""
    if len(path) <= width:
        return path
    parts = path.split("/")
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(kept) + len(part) + 3 > width:
            break
        kept = f"{part}/{kept}"
    return ("…/" + kept)[-width:] if len(kept) < len(path) else kept


def modules_table(report: Report, top: int) -> Table | None:
    """Top module paths by host time per step (forward calls), or None without module events."""
    if not report.modules:
        return None
    device = report.device.present
    table = Table(title=f"Modules, forward (of {len(report.modules)}; mean per step)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for column in ("module", "calls", "host", "host self", *(("device",) if device else ())):
        table.add_column(column, justify="left" if column == "module" else "right", overflow="ellipsis", no_wrap=True)
    for row in report.modules[:top]:
        cells = [short_path(row.path), f"{row.calls_per_step:,.4g}", duration(row.host_us_per_step),
                 duration(row.host_self_us_per_step), *((duration(row.device_us_per_step),) if device else ())]
        table.add_row(*(Text(printable(cell)) for cell in cells))
    return table
