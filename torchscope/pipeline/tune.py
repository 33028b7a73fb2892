"""`tune(script)`: measure the diagnosis's fixes instead of guessing them.

A baseline trial, then one trial per finding whose fixes can be applied without editing the code
(capture/interventions.py), each in its own process (capture/trial.py), then the faster ones together.
Each trial's steady-state step time is compared with the baseline's by the same noise model as `diff`
(pipeline/noise.py). Trials run in a temporary working directory (the script's own outputs, such as
checkpoints, land there and are deleted) unless `in_place`; the environment variable TORCHSCOPE_TRIAL=1
lets a script tell a trial from a real run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import msgspec

from torchscope.capture.interventions import applicable
from torchscope.errors import InputError
from torchscope.pipeline.analyze import analyze
from torchscope.pipeline.diff import step_samples
from torchscope.pipeline.noise import relative_change_interval
from torchscope.report.model import Fix, Report
from torchscope.report.tune import Candidate, TuneResult


@dataclass(frozen=True)
class TuneOptions:
    warmup: int = 2
    active: int = 5
    budget_s: float = 600.0  # no new trial starts after this
    in_place: bool = False  # run trials in the user's working directory (scripts whose inputs are relative)
    timeout_s: float = 300.0  # one trial


@dataclass
class _Trials:
    options: TuneOptions
    command: list[str]
    workdir: Path
    count: int = 0
    started: float = field(default_factory=time.monotonic)

    def run(self, fixes: Sequence[Fix]) -> Report | str:
        """The trial's Report, or why it failed."""
        self.count += 1
        out = self.workdir / f"trial{self.count}"
        fixes_file = self.workdir / f"trial{self.count}.fixes.json"
        fixes_file.write_bytes(msgspec.json.encode(list(fixes)))
        argv = [sys.executable, "-m", "torchscope.capture.trial", "--fixes", str(fixes_file), "--out", str(out),
                "--warmup", str(self.options.warmup), "--active", str(self.options.active), *self.command]
        cwd = os.getcwd() if self.options.in_place else str(self.workdir)
        env = {**os.environ, "TORCHSCOPE_TRIAL": "1"}
        try:
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=self.options.timeout_s)
        except subprocess.TimeoutExpired:
            return f"timed out after {self.options.timeout_s:.0f} s"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"exit {done.returncode}: {last}"
        try:
            return analyze(out, jobs=1)
        except InputError as exc:
            return f"no usable trace: {exc}"

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.options.budget_s


def tune(command: Sequence[str], options: TuneOptions = TuneOptions()) -> TuneResult:
    """`command`: what follows `python` (`script.py args` or `-m module args`), paths as the user gave them."""
    command = _absolute(list(command))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchscope-tune-") as tmp:
        trials = _Trials(options, command, Path(tmp))
        baseline = trials.run([])
        if isinstance(baseline, str):
            raise InputError(f"the baseline run failed ({baseline})")
        base = step_samples(baseline)
        candidates = candidates_from(baseline)
        for candidate in candidates:
            if trials.over_budget():
                candidate.detail = "not run: the time budget was spent"
                continue
            _measure(candidate, trials.run(candidate.fixes), base)
        winners = [c for c in candidates if c.status == "faster"]
        combination = None
        if len(winners) > 1 and not trials.over_budget():
            combination = _combine(winners)
            _measure(combination, trials.run(combination.fixes), base)
    best = max([c for c in [*candidates, combination] if c is not None and c.status == "faster"],
               key=lambda c: c.speedup or 0.0, default=None)
    verdict = (f"best: {best.fix} ({best.speedup:.2f}x)" if best is not None
               else "no candidate beats the baseline beyond noise")
    return TuneResult(
        command=command, baseline_step_us=sum(base) / len(base) if base else 0.0, baseline_steps=len(base),
        candidates=candidates, combination=combination, trials=trials.count,
        elapsed_s=time.monotonic() - started, verdict=verdict,
        notes=[] if candidates else ["the diagnosis proposed no fix that a trial can apply without editing the code"],
    )


def _absolute(command: list[str]) -> list[str]:
    """Trials run elsewhere: the script's path is made absolute (a module name is left as is)."""
    if command and command[0] != "-m" and os.path.exists(command[0]):
        return [os.path.abspath(command[0]), *command[1:]]
    return command


def candidates_from(report: Report) -> list[Candidate]:
    """One candidate per finding with applicable fixes (a finding's fixes go together: persistent
    workers mean nothing without workers), most costly finding first; duplicates dropped."""
    seen: set[tuple[tuple[str, str, str], ...]] = set()
    out = []
    for finding in report.findings:
        fixes = [f for f in finding.fixes if applicable(f)]
        key = tuple(sorted((f.kind, f.target, repr(f.value)) for f in fixes))
        if not fixes or key in seen:
            continue
        seen.add(key)
        out.append(Candidate(
            fix=", ".join(_describe(f) for f in fixes), description=f"{finding.id}: {finding.title}", fixes=fixes,
            finding=finding.id, predicted_saving=finding.time_share,
        ))
    return out


def _describe(fix: Fix) -> str:
    if fix.kind == "code_change":
        return fix.target
    return f"{fix.target}={fix.value!r}" if not isinstance(fix.value, str) else f"{fix.target}={fix.value}"


def _measure(candidate: Candidate, trial: Report | str, base: list[float]) -> None:
    if isinstance(trial, str):
        candidate.status, candidate.detail = "failed", trial
        return
    samples = step_samples(trial)
    interval = relative_change_interval(base, samples)
    mean = sum(samples) / len(samples) if samples else 0.0
    candidate.step_us = mean
    candidate.speedup = 1.0 / (1.0 + interval.change_pct / 100.0) if interval.change_pct > -100 else None
    if interval.low_pct is not None and interval.high_pct is not None and interval.low_pct > -100:
        candidate.ci_low = 1.0 / (1.0 + interval.high_pct / 100.0)
        candidate.ci_high = 1.0 / (1.0 + interval.low_pct / 100.0)
    candidate.significant = interval.significant
    candidate.measured_saving = -interval.change_pct / 100.0
    candidate.status = ("faster" if interval.change_pct < 0 else "slower") if interval.significant else "no significant change"
    candidate.detail = interval.method


def _combine(winners: list[Candidate]) -> Candidate:
    """The winners' fixes together; where two set the same keyword, the faster candidate's value."""
    chosen: dict[tuple[str, str], Fix] = {}
    for candidate in sorted(winners, key=lambda c: c.speedup or 0.0):
        for fix in candidate.fixes:
            chosen[(fix.kind, fix.target)] = fix
    fixes = list(chosen.values())
    return Candidate(fix=", ".join(_describe(f) for f in fixes), description="the faster candidates together", fixes=fixes)
