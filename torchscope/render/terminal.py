"""Terminal renderer: findings first (what, what it costs, evidence, fix), then the step-time breakdown
and the operator, kernel and range tables. Uses rich; colour only when asked (the CLI asks on a TTY)."""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from torchscope.render.distributed_terminal import distributed_section
from torchscope.render.fit import fit_names
from torchscope.render.callsites_terminal import call_sites_table
from torchscope.render.memory_terminal import memory_table
from torchscope.render.overhead_terminal import overhead_table
from torchscope.render.modules_terminal import modules_table
from torchscope.render.registry import RenderOptions, register
from torchscope.render.units import duration, size
from torchscope.report.model import CategoryTime, Finding, Report

# Names come from the trace (user code): control characters would move the cursor or recolour the
# terminal, so they are shown escaped (\x1b), never sent.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if c not in (0x0A,)}
_CONTROL_IN_CELLS = {**_CONTROL, 0x0A: "\\n"}


def _safe(text: str, cell: bool = False) -> str:
    return text.translate(_CONTROL_IN_CELLS if cell else _CONTROL)


def _text(value: str, style: str = "") -> Text:
    """A table cell: never read as rich markup, control characters escaped."""
    return Text(_safe(value, cell=True), style=style)


SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
BAR_WIDTH = 30
TOP_ROWS = 10


def render_terminal(
    report: Report, width: int | None = None, color: bool = False, by_shape: bool = False, top: int = TOP_ROWS
) -> str:
    """The terminal report as text (ANSI colour codes only when `color`)."""
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=width or 100, force_terminal=color, color_system="auto" if color else None,
        highlight=False, soft_wrap=False,
    )
    for block in (
        _header(report),
        _findings(report.findings),
        _breakdown("Step time breakdown (mean per step)", report.breakdown, report.mean_step_us),
        _breakdown("Training phases (host)", report.phases, report.mean_step_us) if report.run.device_kind != "cpu" else None,
        overhead_table(report),
        _operators(report, by_shape, top, console.width),
        call_sites_table(report, top, console.width),
        _kernels(report, top, console.width),
        _ranges(report, top, console.width),
        modules_table(report, top),
        memory_table(report.memory),
        _spans(report, console.width),
        distributed_section(report.distributed) or _ranks(report),
        _warnings(report),
    ):
        if block is not None:
            console.print(block)
    return buffer.getvalue()


def _header(report: Report) -> Text:
    durations = [s.duration_us for s in report.steps]
    mean = report.mean_step_us
    spread = (max(durations) - min(durations)) if durations else 0.0
    text = Text()
    text.append("torchscope", style="bold")
    text.append(_safe(f"  {', '.join(report.run.paths)}", cell=True) + "\n")
    ranks = report.run.ranks
    text.append(
        f"{report.run.device_kind.upper()} trace, {len(report.run.trace_files)} file(s), "
        f"{len(ranks)} rank(s), {len(report.steps)} step(s)"
    )
    if report.run.step_source == "whole_trace":
        text.append(" (no ProfilerStep markers: whole trace as one window)", style="yellow")
    text.append(f"\nstep time: mean {duration(mean)}, min {duration(min(durations, default=0))}, max {duration(max(durations, default=0))} (spread {duration(spread)})")
    text.append(_step_confidence(report))
    if report.device.present and report.device.utilization is not None:
        name = f" {_safe(report.device.name, cell=True)}" if report.device.name else ""
        device = report.device
        text.append(f"\nGPU{name}: utilisation {100 * report.device.utilization:.1f}%")
        text.append(f"  est. SM efficiency {_percent(device.sm_efficiency, 100)}")
        text.append(f"  est. occupancy {_percent(device.achieved_occupancy_pct)}")
    return text


WIDE_INTERVAL_PERCENT = 25.0  # above it the step line says how many recorded steps would give ±10 %


def _step_confidence(report: Report) -> str:
    """The step time's variation and its mean's 95 % interval (measurements.step_time), recorded steps and
    the capture's unprofiled ones; empty when there is nothing to say."""
    st = report.measurements.step_time
    parts = []
    if st.ci_half_percent > 0:
        more = f", --active {st.steps_for_10_percent:.0f} for ±10%" if st.ci_half_percent > WIDE_INTERVAL_PERCENT else ""
        parts.append(f"mean within ±{st.ci_half_percent:.0f}% (95% CI, {st.steps:.0f} steps, cv {st.cv_percent:.0f}%{more})")
    if st.unprofiled_steps >= 2:
        parts.append(f"unprofiled {duration(st.unprofiled_mean_us)} ±{st.unprofiled_ci_half_percent:.0f}% "
                     f"({st.unprofiled_steps:.0f} steps, cv {st.unprofiled_cv_percent:.0f}%)")
    return ("\n  " + "; ".join(parts)) if parts else ""


def _percent(value: float | None, scale: float = 1.0) -> str:
    """A percentage, or "n/a" when the trace did not have what it needs (never a made-up 0)."""
    return "n/a" if value is None else f"{scale * value:.1f}%"


MINOR_SHARE = 0.02  # info findings saving less than this are kept in the JSON, not listed here


def _is_minor(f: Finding) -> bool:
    return f.severity == "info" and f.time_share is not None and f.time_share < MINOR_SHARE


def _findings(findings: list[Finding]) -> Any:
    if not findings:
        return Panel("No findings.", title="Diagnosis", box=box.ROUNDED)
    parts: list[Any] = []
    minor = sum(1 for f in findings if _is_minor(f))
    for number, f in enumerate((f for f in findings if not _is_minor(f)), 1):
        head = Text()
        head.append(f"{number}. ")
        head.append(f"[{f.severity.upper()}] ", style=SEVERITY_STYLE[f.severity])
        head.append(f"{f.category}: ", style="bold")
        head.append(_safe(f.title, cell=True))
        if f.time_share is not None:
            head.append(f"  ({_saving(f)})", style="bold")
        parts.append(head)
        evidence = ", ".join(f"{k}={_evidence_value(k, v)}" for k, v in f.evidence.items() if v not in (None, {}, []))
        if evidence:
            parts.append(Text(_safe(f"   evidence: {evidence}", cell=True), style="dim"))
        parts.append(Text(_safe(f"   fix: {f.recommendation}", cell=True)))
    if minor:
        parts.append(Text(f"+ {minor} minor finding(s), each saving under {100 * MINOR_SHARE:.0f}% of the step: "
                          "see the JSON report", style="dim"))
    return Panel(Group(*parts), title="Diagnosis (most costly first)", box=box.ROUNDED)


def _saving(f: Finding) -> str:
    """What a fix saves: the estimate, with its range when the what-if model gives one."""
    assert f.time_share is not None
    text = f"a fix saves ~{100 * f.time_share:.1f}% of the step"
    low, high = f.time_share_low, f.time_share_high
    if low is not None and high is not None and round(100 * low, 1) != round(100 * high, 1):
        text += f", {100 * low:.1f}-{100 * high:.1f}%"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _evidence_value(key: str, value: Any) -> str:
    """Units from the key's name: *_us* -> us, *share*/*fraction*/utilization -> %, *bytes* -> MiB."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if _in_us(key):  # the unit the key names, never converted (exposed_us_per_step=56,310 us)
            return _us(float(value))
        if "share" in key or "fraction" in key or key.endswith(("utilization", "efficiency", "spread", "ratio")):
            return f"{100 * float(value):.1f}%"
        if "bytes" in key:
            return size(float(value))
    if isinstance(value, dict) and "bytes" in key:  # {call site: bytes}
        return "{" + ", ".join(f"{k}: {size(float(v)) if _is_number(v) else _value(v)}" for k, v in list(value.items())[:5]) + "}"
    if isinstance(value, dict) and _in_us(key):
        # A plug-in's or an old report's dict may hold None or text beside the numbers.
        shown = (f"{k}: {_us(float(v)) if _is_number(v) else _value(v)}" for k, v in list(value.items())[:5])
        return "{" + ", ".join(shown) + "}"
    return _value(value)


def _in_us(key: str) -> bool:
    return key.endswith("_us") or "_us_" in key


def _us(value: float) -> str:
    return f"{value:,.0f} us"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in list(value.items())[:5]) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value[:8]) + "]"
    return str(value)


def _breakdown(title: str, breakdown: dict[str, CategoryTime], mean_step: float) -> Table | None:
    if not breakdown:
        return None
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("category")
    table.add_column("per step", justify="right")
    table.add_column("%", justify="right")
    table.add_column("")
    for name, value in breakdown.items():
        filled = round(BAR_WIDTH * value.percent / 100)
        table.add_row(name, duration(value.us), f"{value.percent:.1f}", "█" * filled + "·" * (BAR_WIDTH - filled))
    table.add_row("total", duration(mean_step), "100.0", "", style="bold")
    return table


def _operators(report: Report, by_shape: bool, top: int, width: int = 100) -> Table | None:
    rows = report.operators_by_shape if by_shape else report.operators
    if not rows:
        return None
    device = report.device.present
    title = f"Top operators{' by input shape' if by_shape else ''} (of {len(rows)}; totals over the whole trace)"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    columns = ("operator",) + (("input shapes",) if by_shape else ()) + ("calls", "host self", "host total")
    for column in columns + (("device self", "device total") if device else ()):
        table.add_column(column, justify="left" if column in ("operator", "input shapes") else "right", overflow="ellipsis", no_wrap=True)
    for row in rows[:top]:
        cells = [row.name] + ([row.input_shapes or ""] if by_shape else []) + [f"{row.calls:,}", duration(row.host_self_us), duration(row.host_total_us)]
        if device:
            cells += [duration(row.device_self_us), duration(row.device_total_us)]
        table.add_row(*map(_text, cells))  # Text: names are never read as rich markup
    return fit_names(table, width, {"operator": 3, "input shapes": 2})


def _kernels(report: Report, top: int, width: int = 100) -> Table | None:
    if not report.kernels:
        return None
    table = Table(title=f"Top kernels (of {len(report.kernels)}; totals over the whole trace)", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("kernel", "calls", "total", "mean", "occupancy", "TC", "launched by"):
        table.add_column(column, justify="left" if column in ("kernel", "launched by") else "right", overflow="ellipsis", no_wrap=True)
    for row in report.kernels[:top]:
        occupancy = f"{row.mean_occupancy_pct:.0f}%" if row.mean_occupancy_pct is not None else "-"
        table.add_row(*map(_text, (row.name, f"{row.calls:,}", duration(row.total_us), duration(row.mean_us), occupancy, "yes" if row.tensor_core else "no", row.launched_by)))
    return fit_names(table, width, {"kernel": 2, "launched by": 1})


def _ranges(report: Report, top: int, width: int = 100) -> Table | None:
    if not report.ranges:
        return None
    table = Table(title="record_function ranges", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("range", "calls", "total", "mean"):
        table.add_column(column, justify="left" if column == "range" else "right", overflow="ellipsis", no_wrap=True)
    for row in report.ranges[:top]:
        table.add_row(*map(_text, (row.name, f"{row.calls:,}", duration(row.total_us), duration(row.mean_us))))
    return fit_names(table, width, {"range": 1})


def _spans(report: Report, width: int = 100) -> Table | None:
    """Per-span breakdown when a worker wrote several files (schedule cycles)."""
    if len(report.spans) < 2 or len(report.spans) == len(report.ranks):
        return None
    categories = list(report.breakdown)
    table = Table(title="Per span (% of step)", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("rank", "file", "steps", "mean step", *categories):
        table.add_column(column, justify="left" if column == "file" else "right", overflow="ellipsis", no_wrap=True)
    for span in report.spans:
        cells = [f"{span.breakdown[c].percent:.1f}" if c in span.breakdown else "-" for c in categories]
        table.add_row(*map(_text, (str(span.rank), span.file, str(len(span.steps)), duration(span.mean_step_us), *cells)))
    return fit_names(table, width, {"file": 1})


def _ranks(report: Report) -> Table | None:
    if len(report.ranks) < 2:
        return None
    table = Table(title="Ranks", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("rank", "steps", "mean step", "communication", "compute"):
        table.add_column(column, justify="right")
    for r in report.ranks:
        table.add_row(str(r.rank), str(r.steps), duration(r.mean_step_us), duration(r.comm_us_per_step), duration(r.compute_us_per_step))
    return table


def _warnings(report: Report) -> Text | None:
    if not report.warnings:
        return None
    return Text("warnings:\n" + "\n".join(f"  {_safe(w, cell=True)}" for w in report.warnings[:10]), style="yellow")


class TerminalRenderer:
    name = "terminal"
    extension = ".txt"

    def render(self, report: Report, options: RenderOptions) -> str:
        return render_terminal(report, width=options.width, color=options.color, by_shape=options.by_shape, top=options.top)


register(TerminalRenderer())
