"""HTML rendering of a TuneResult: one small static page (no script, no network): the verdict, a table of
candidates with speed-up, interval, status and predicted vs measured saving, and each winner's code
change. All user-derived text is escaped (torchscope.text.printable, then HTML)."""

from __future__ import annotations

from html import escape

from torchscope.render.tune_terminal import prediction_text, speedup_text
from torchscope.render.units import duration
from torchscope.report.tune import Candidate, TuneResult
from torchscope.text import printable

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2430;max-width:1100px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}.verdict{font-size:18px;margin:12px 0}
table{border-collapse:collapse;width:100%}td,th{padding:3px 8px;border-bottom:1px solid #e3e7ee;text-align:left;vertical-align:top}
.faster{color:#17803d;font-weight:600}.slower,.failed,.loss{color:#c0262d}.muted{color:#6b7585}
pre{background:#f4f6f9;padding:8px;overflow-x:auto}
"""


def _text(value: str) -> str:
    return escape(printable(value))


def render_tune_html(result: TuneResult) -> str:
    rows = [*result.candidates, *([result.combination] if result.combination else [])]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>torchscope tune</title>",
        f"<style>{_STYLE}</style></head><body><h1>torchscope tune</h1>",
        f"<div class='muted'>{_text(' '.join(result.command))}</div>",
        f"<div class='verdict'>{_text(result.verdict)}</div>",
        f"<div class='muted'>baseline step time {duration(result.baseline_step_us)} over {result.baseline_steps} steps, "
        f"run-to-run noise {result.noise_pct:.1f} %; "
        f"{result.trials} trial(s) in {result.elapsed_s:.0f} s</div>",
        *(f"<p class='muted'>note: {_text(n)}</p>" for n in result.notes),
        "<h2>Candidates</h2><table><tr><th>fix</th><th>status</th><th>speed-up</th><th>saving</th><th>finding</th></tr>",
        *(_row(c, c is result.combination, result.confidence) for c in rows),
        "</table>",
    ]
    winners = [c for c in rows if c.change and c.status == "faster"]
    if winners:
        parts.append("<h2>Code changes</h2>")
        parts += [f"<h3>{_text(c.fix)}</h3><pre>{_text(chr(10).join(c.change))}</pre>" for c in winners]
    parts.append("</body></html>\n")
    return "".join(parts)


def _row(c: Candidate, combination: bool, confidence: float) -> str:
    css = {"faster": "faster", "slower": "slower", "failed": "failed", "loss changed": "loss"}.get(c.status, "muted")
    detail = f"<br><span class='muted'>{_text(c.detail)}</span>" if c.detail and c.status not in ("faster", "slower", "no significant change") else ""
    if c.compile_s is not None:
        detail += f"<br><span class='muted'>compile {c.compile_s:.1f} s (not in the step times)</span>"
    finding = "the faster candidates together" if combination else c.description
    return (f"<tr><td>{_text(c.fix)}</td><td class='{css}'>{_text(c.status)}{detail}</td><td>{_text(speedup_text(c, confidence))}</td>"
            f"<td>{_text(prediction_text(c))}</td><td>{_text(finding)}</td></tr>")
