"""HTML rendering of a ReportDiff: one self-contained, static page (no script, no network): the verdict on
step time, the breakdown side by side as bars, the metrics that moved, the top operator and kernel
movers and the findings that changed. All user-derived text is escaped."""

from __future__ import annotations

from html import escape

from torchscope.render.units import duration, share
from torchscope.report.diff import CategoryChange, ReportDiff, RowChange

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2430;max-width:1100px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.verdict{font-size:18px;margin:12px 0}.faster,.better{color:#17803d}.slower,.worse{color:#c0262d}
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #e3e7ee;text-align:right}
td:first-child,th:first-child{text-align:left;word-break:break-all}
.bar{height:10px;display:inline-block;vertical-align:middle}.base{background:#8aa4c8}.new{background:#e39b4b}
.muted{color:#6b7585}.fail{color:#c0262d;font-weight:600}.pass{color:#17803d;font-weight:600}
"""


def render_diff_html(diff: ReportDiff, top: int = 15) -> str:
    s = diff.step_time
    ci = f" (95 % CI {s.ci_low_pct:+.1f} to {s.ci_high_pct:+.1f} %)" if s.ci_low_pct is not None and s.ci_high_pct is not None else ""
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>torchscope diff</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>torchscope diff</h1><div class='muted'>base {escape(diff.base.path)} ({s.base_steps} steps) vs new "
        f"{escape(diff.new.path)} ({s.new_steps} steps)</div>",
        f"<div class='verdict'>Step time {duration(s.base_us)} &rarr; {duration(s.new_us)}: {s.change_pct:+.1f} %{ci} "
        f"<b class='{_cls(s.verdict)}'>{escape(s.verdict)}</b></div><div class='muted'>{escape(s.method)}</div>",
        *(f"<p class='muted'>warning: {escape(w)}</p>" for w in diff.warnings),
    ]
    if diff.gate is not None:
        parts.append(f"<p class='{'fail' if diff.gate.failed else 'pass'}'>{'FAIL' if diff.gate.failed else 'PASS'}: "
                     f"{escape(diff.gate.explanation)}</p>")
    parts += [_breakdown(diff.breakdown), _metrics(diff), _movers("Operators (time per step)", diff.operators, top),
              _movers("Kernels (time per step)", diff.kernels, top), _findings(diff), "</body></html>"]
    return "".join(parts)


def _cls(verdict: str) -> str:
    return verdict if verdict in ("faster", "slower", "better", "worse") else "muted"


def _breakdown(rows: list[CategoryChange]) -> str:
    if not rows:
        return ""
    scale = max([max(r.base_us, r.new_us) for r in rows] + [1e-9])
    body = "".join(
        f"<tr><td>{escape(r.category)}</td><td>{duration(r.base_us)}</td><td>{duration(r.new_us)}</td><td>{r.change_pp:+.1f} pp</td>"
        f"<td style='text-align:left'><span class='bar base' style='width:{200 * r.base_us / scale:.0f}px'></span><br>"
        f"<span class='bar new' style='width:{200 * r.new_us / scale:.0f}px'></span></td></tr>"
        for r in rows
    )
    return ("<h2>Step time breakdown (mean per step; <span class='bar base' style='width:12px'></span> base, "
            "<span class='bar new' style='width:12px'></span> new)</h2><table><tr><th>category</th><th>base</th>"
            f"<th>new</th><th>share change</th><th></th></tr>{body}</table>")


def _metrics(diff: ReportDiff) -> str:
    moved = [m for m in diff.metrics if m.verdict in ("better", "worse")]
    if not moved:
        return "<h2>Metrics</h2><p class='muted'>no metric moved beyond noise</p>"
    body = "".join(
        f"<tr><td>{escape(m.name)}</td><td>{m.base:,.4g}</td><td>{m.new:,.4g}</td>"
        f"<td>{'' if m.change_pct is None else f'{m.change_pct:+.1f} %'}</td><td class='{_cls(m.verdict)}'>{m.verdict}</td></tr>"
        for m in moved
    )
    return f"<h2>Metrics that moved beyond noise</h2><table><tr><th>metric</th><th>base</th><th>new</th><th>change</th><th></th></tr>{body}</table>"


def _muted(text: str | None) -> str:
    return f" <span class=muted>{escape(text)}</span>" if text else ""


def _movers(title: str, rows: list[RowChange], top: int) -> str:
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{escape(r.name)}{_muted(r.input_shapes)}{_muted('@ ' + r.call_site if r.call_site else None)}"
        f"{_muted('by ' + r.launched_by if r.launched_by else None)}</td>"
        f"<td>{duration(r.base_us_per_step)}</td><td>{duration(r.new_us_per_step)}</td>"
        f"<td class='{'slower' if r.change_us_per_step > 0 else 'faster'}'>{'+' if r.change_us_per_step >= 0 else '-'}{duration(abs(r.change_us_per_step))}</td>"
        f"<td>{'' if r.status == 'changed' else r.status}</td></tr>"
        for r in rows[:top]
    )
    return f"<h2>{escape(title)}</h2><table><tr><th>name</th><th>base</th><th>new</th><th>change</th><th></th></tr>{body}</table>"


def _findings(diff: ReportDiff) -> str:
    moved = [f for f in diff.findings if f.status != "unchanged"]
    if not moved:
        return ""
    body = "".join(
        f"<tr><td>{escape(f.id)}<div class='muted'>{escape(f.title)}</div></td><td>{f.status}</td>"
        f"<td>{share(f.base_share)}</td><td>{share(f.new_share)}</td></tr>"
        for f in moved
    )
    return f"<h2>Findings</h2><table><tr><th>finding</th><th>status</th><th>cost base</th><th>cost new</th></tr>{body}</table>"


