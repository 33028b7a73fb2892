"""Terminal rendering of a TuneResult: the verdict, then each candidate with its measured speed-up."""

from __future__ import annotations

from torchscope.render.units import duration
from torchscope.report.tune import Candidate, TuneResult

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))}


def render_tune_terminal(result: TuneResult) -> str:
    lines = [
        f"torchscope tune: {' '.join(result.command)}".translate(_CONTROL),
        f"baseline step time {duration(result.baseline_step_us)} over {result.baseline_steps} steps; "
        f"{result.trials} trial(s) in {result.elapsed_s:.0f} s",
        f"verdict: {result.verdict}",
        "",
    ]
    for candidate in result.candidates + ([result.combination] if result.combination else []):
        lines += _candidate(candidate)
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines) + "\n"


def _candidate(c: Candidate) -> list[str]:
    speed = f"{c.speedup:.2f}x" if c.speedup is not None else "n/a"
    ci = f" (95 % CI {c.ci_low:.2f}-{c.ci_high:.2f}x)" if c.ci_low is not None and c.ci_high is not None else ""
    predicted = (f"; the diagnosis expected {100 * c.predicted_saving:.0f} % saved, measured {100 * c.measured_saving:.0f} %"
                 if c.predicted_saving is not None and c.measured_saving is not None else "")
    return [
        f"  [{c.status}] {c.fix}: {speed}{ci}{predicted}".translate(_CONTROL),
        f"      {c.description}".translate(_CONTROL),
        *([f"      {c.detail}".translate(_CONTROL)] if c.detail and c.status in ("failed", "skipped") else []),
    ]
