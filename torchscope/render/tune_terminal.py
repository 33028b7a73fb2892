"""Terminal rendering of a TuneResult: the verdict, then each candidate with its measured speed-up, the
diagnosis's prediction next to the measured saving, and for a winner the code change."""

from __future__ import annotations

import textwrap

from torchscope.render.units import duration
from torchscope.report.tune import Candidate, TuneResult
from torchscope.text import printable


DEFAULT_WIDTH = 100


def render_tune_terminal(result: TuneResult, width: int = DEFAULT_WIDTH) -> str:
    """The result as text, every line within `width` columns (longer ones wrap under their own indent)."""
    lines = [
        printable(f"torchscope tune: {' '.join(result.command)}"),
        f"baseline step time {duration(result.baseline_step_us)} over {result.baseline_steps} steps, run-to-run "
        f"noise {result.noise_pct:.1f} %; "
        f"{result.trials} trial(s) in {result.elapsed_s:.0f} s",
        printable(f"verdict: {result.verdict}"),
        "",
    ]
    for candidate in result.candidates:
        lines += _candidate(candidate, result.confidence)
    if result.combination is not None:
        lines += ["combination:", *_candidate(result.combination, result.confidence)]
    lines += [printable(f"note: {note}") for note in result.notes]
    return "".join(line + "\n" for text in lines for line in _wrap(text, width))


def _wrap(line: str, width: int) -> list[str]:
    """`line` cut into lines of at most `width` columns at spaces (a longer word is split), the follow-on
    lines indented 4 more than the first: a code change or a path stays readable and copyable piece by piece."""
    if len(line) <= width:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + 4, width // 2)
    return textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False, drop_whitespace=True) or [line[:width]]


def speedup_text(c: Candidate, confidence: float = 0.95) -> str:
    """`1.52x (95 % CI 1.31-1.80x)`; an unbounded side of the interval shows as `inf`."""
    if c.speedup is None:
        return "n/a"
    if c.ci_low is None and c.ci_high is None:
        return f"{c.speedup:.2f}x"
    low = f"{c.ci_low:.2f}" if c.ci_low is not None else "0"
    high = f"{c.ci_high:.2f}" if c.ci_high is not None else "inf"
    return f"{c.speedup:.2f}x ({100 * confidence:g} % CI {low}-{high}x)"


def prediction_text(c: Candidate) -> str:
    """The diagnosis's predicted saving next to the measured one."""
    if c.measured_saving is None:
        return ""
    predicted = f"predicted {100 * c.predicted_saving:.0f} %" if c.predicted_saving is not None else "no prediction"
    return f"saving: {predicted}, measured {100 * c.measured_saving:.0f} %"


def _candidate(c: Candidate, confidence: float) -> list[str]:
    lines = [f"  [{c.status}] {c.fix}: {speedup_text(c, confidence)}", f"      {c.description}"]
    extra = [prediction_text(c)]
    if c.loss_change is not None:
        extra.append(f"loss {100 * c.loss_change:+.1f} %")
    if c.compile_s is not None:
        extra.append(f"compile {c.compile_s:.1f} s (not in the step times)")
    if c.measured_saving is not None and c.finding is not None:
        extra.append("finding gone in the trial" if c.finding_after is None
                     else f"finding still at {100 * c.finding_after:.0f} % of the step")
    if any(extra):
        lines.append("      " + "; ".join(e for e in extra if e))
    if c.status not in ("faster", "slower", "no significant change") and c.detail:
        lines.append(f"      {c.detail}")
    lines += [f"      {line}" for line in c.change]
    return [printable(line) for line in lines]
