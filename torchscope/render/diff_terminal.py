"""Terminal rendering of a ReportDiff: the verdict on step time first, then the breakdown, the metrics
that moved, the top operator and kernel movers and the findings that changed; the gate's answer last."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchscope.render.units import duration, share
from torchscope.report.diff import ReportDiff, RowChange
from torchscope.text import printable

VERDICT_STYLE = {"faster": "bold green", "better": "green", "slower": "bold red", "worse": "red"}


def _text(value: str, style: str = "") -> Text:
    """User-derived text (names, paths): never rich markup, control characters escaped."""
    return Text(printable(value), style=style)


def render_diff_terminal(diff: ReportDiff, width: int | None = None, color: bool = False, top: int = 10) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width or 100, force_terminal=color, color_system="auto" if color else None,
                      highlight=False, soft_wrap=False)
    console.print(_headline(diff))
    for warning in diff.warnings:
        console.print(_text(f"warning: {warning}", "yellow"))
    for table in (_breakdown(diff), _metrics(diff), _movers("Operators (time per step)", diff.operators, top),
                  _movers("Kernels (time per step)", diff.kernels, top), _findings(diff)):
        if table is not None:
            console.print(table)
    if diff.gate is not None:
        console.print(Text(("FAIL: " if diff.gate.failed else "PASS: ") + diff.gate.explanation,
                           style="bold red" if diff.gate.failed else "bold green"))
    return buffer.getvalue()


def _headline(diff: ReportDiff) -> Text:
    s = diff.step_time
    text = Text()
    text.append("base ")
    text.append_text(_text(diff.base.path, "bold"))
    text.append(f" ({s.base_steps} steps)  vs  new ")
    text.append_text(_text(diff.new.path, "bold"))
    text.append(f" ({s.new_steps} steps)\n")
    text.append(f"Step time {duration(s.base_us)} -> {duration(s.new_us)}: {s.change_pct:+.1f} %")
    if s.ci_low_pct is not None and s.ci_high_pct is not None:
        text.append(f" (95 % CI {s.ci_low_pct:+.1f} to {s.ci_high_pct:+.1f} %)")
    text.append(" -> ")
    text.append(s.verdict.upper(), style=VERDICT_STYLE.get(s.verdict, "bold"))
    text.append(f"\n{s.method}")
    return text


def _breakdown(diff: ReportDiff) -> Table | None:
    if not diff.breakdown:
        return None
    table = Table(title="Step time breakdown (mean per step)", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("category", "base", "new", "change", "share base", "share new", "share change"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for c in diff.breakdown:
        table.add_row(_text(c.category), duration(c.base_us), duration(c.new_us), f"{'+' if c.change_us >= 0 else '-'}{duration(abs(c.change_us))}",
                      f"{c.base_percent:.1f} %", f"{c.new_percent:.1f} %", f"{c.change_pp:+.1f} pp")
    return table


def _metrics(diff: ReportDiff) -> Table | None:
    moved = [m for m in diff.metrics if m.verdict in ("better", "worse")]
    if not moved:
        return None
    table = Table(title="Metrics that moved beyond noise", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("metric", "base", "new", "change", "verdict"):
        table.add_column(column, justify="left" if column in ("metric", "verdict") else "right")
    for m in moved:
        table.add_row(_text(m.name), f"{m.base:,.4g}", f"{m.new:,.4g}", f"{m.change_pct:+.1f} %" if m.change_pct is not None else "n/a",
                      Text(m.verdict, style=VERDICT_STYLE.get(m.verdict, "")))
    return table


def _movers(title: str, rows: list[RowChange], top: int) -> Table | None:
    if not rows:
        return None
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("name", "base", "new", "change", ""):
        table.add_column(column, justify="left" if column in ("name", "") else "right", overflow="fold")
    for r in rows[:top]:
        name = r.name + (f" {r.input_shapes}" if r.input_shapes else "") + (f" @ {r.call_site}" if r.call_site else "")
        name += f" (by {r.launched_by})" if r.launched_by else ""
        sign = "+" if r.change_us_per_step >= 0 else "-"
        table.add_row(_text(name), duration(r.base_us_per_step), duration(r.new_us_per_step), f"{sign}{duration(abs(r.change_us_per_step))}",
                      r.status if r.status != "changed" else "")
    return table


def _findings(diff: ReportDiff) -> Table | None:
    moved = [f for f in diff.findings if f.status != "unchanged"]
    if not moved:
        return None
    table = Table(title="Findings", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("finding", "status", "cost base", "cost new"):
        table.add_column(column, justify="left" if column in ("finding", "status") else "right")
    for f in moved:
        table.add_row(_text(f.id), f.status, share(f.base_share), share(f.new_share))
    return table


