"""`tune(script)`: measure the diagnosis's fixes instead of guessing them.

A baseline trial, then one trial per candidate: a finding's fixes that can be applied without editing
the code (capture/interventions.py), each in its own process (capture/trial.py); then the faster,
compatible ones together, re-measured. Each trial's steady-state step time is compared with the
baseline's by the same noise model as `diff` (pipeline/noise.py: Welch's t interval over the measured
steps with a run-to-run floor).

Safety: trials run in a temporary working directory (the script's own outputs, such as checkpoints,
land there and are deleted) unless `in_place`; the environment variable TORCHSCOPE_TRIAL=1 lets a
script tell a trial from a real run. A trial that fails, or whose mean loss moves beyond
`loss_tolerance` of the baseline's, is reported and never used. A trial still running after
`early_stop` times the baseline trial's wall time is stopped as clearly slower. Ctrl-C stops the running
trial and returns what was measured.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import msgspec

from torchscope.capture.interventions import (
    COMPILE_FIX,
    COMPILE_TARGET,
    DATALOADER_KEYWORDS,
    OPTIMIZER_KEYWORDS,
    applicable,
    autocast_dtype,
    is_autocast,
    is_compile,
    label,
    needs_cuda,
)
from torchscope.capture.trial import TrialRecord
from torchscope.errors import InputError, UsageError
from torchscope.pipeline.analyze import analyze
from torchscope.pipeline.diff import step_samples
from torchscope.pipeline.noise import run_level_interval
from torchscope.pipeline.tune_snippets import code_change
from torchscope.report.model import Fix, FixValue, Report
from torchscope.report.tune import Candidate, TuneResult

TRIAL_ENV = "TORCHSCOPE_TRIAL"
# The least run-to-run noise tune assumes: its own two baselines measure the rest (diff's default floor is
# larger, for runs made at different times, possibly on different machines).
NOISE_FLOOR_PCT = 2.0
# Keywords that exclude each other: one candidate each, and never both in the combination.
ALTERNATIVES = (
    frozenset({("optimizer_kwarg", "foreach"), ("optimizer_kwarg", "fused")}),
    frozenset({("code_change", "torch.autocast"), ("torch_flag", "torch.backends.cuda.matmul.allow_tf32")}),
)


class TuneOptions(msgspec.Struct, frozen=True):
    warmup: int = 2
    active: int = 5
    budget_s: float = 600.0  # no trial starts, and a running one is stopped, once this is spent
    in_place: bool = False  # run trials in the user's working directory (scripts whose inputs are relative)
    timeout_s: float = 600.0  # one trial, the baseline included
    loss_tolerance: float = 0.1  # relative change of the mean loss beyond which a trial is not used
    early_stop: float = 3.0  # a trial running this many times the baseline trial's wall time is clearly slower
    compile_allowance_s: float = 300.0  # added to a torch.compile trial's early-stop limit: compiling is not slowness
    repeats: int = 2  # trials of a candidate at most: another while the first is within noise
    baselines: int = 3  # baseline trials: their spread is the run-to-run noise estimate (2 degrees of freedom)
    confidence: float = 0.95  # of the speed-up's interval: a candidate is faster or slower only beyond it
    nproc_per_node: int = 0  # >0: each trial is a torchrun launch of that many ranks (--standalone)
    extra: tuple[tuple[Fix, ...], ...] = ()  # candidates the user asked for (`--try`), besides the diagnosis's
    only: bool = False  # run the `extra` candidates alone; the diagnosis's others are listed, skipped (`--only`)
    keep: Optional[Path] = None  # keep each trial's run directory here (by default deleted with the rest)


class _Trial(msgspec.Struct, frozen=True):
    report: Report
    record: TrialRecord
    wall_s: float
    out: Path


_Outcome = Union[_Trial, str]  # a string: why the trial gave no measurement


class _Trials(msgspec.Struct):
    options: TuneOptions
    command: list[str]
    workdir: Path
    outdir: Path
    count: int = 0
    started: float = msgspec.field(default_factory=time.monotonic)

    def run(self, fixes: Sequence[Fix], limit_s: float) -> _Outcome:
        self.count += 1
        out = self.outdir / f"trial{self.count}"
        fixes_file = self.workdir / f"trial{self.count}.fixes.json"
        record_file = self.workdir / f"trial{self.count}.record.json"
        fixes_file.write_bytes(msgspec.json.encode(list(fixes)))
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.options.nproc_per_node}"] \
            if self.options.nproc_per_node else []
        argv = [sys.executable, *launcher, "-m", "torchscope.capture.trial", "--fixes", str(fixes_file), "--out", str(out),
                "--record", str(record_file), "--warmup", str(self.options.warmup), "--active", str(self.options.active),
                *self.command]
        cwd = os.getcwd() if self.options.in_place else str(self.workdir / f"trial{self.count}.cwd")
        os.makedirs(cwd, exist_ok=True)
        env = {**os.environ, TRIAL_ENV: "1"}
        # torch.compile's caches in tune's temporary folder: shared by its trials, never the user's, and cold
        # at the start (the compile time reported is a first compile's).
        env["TORCHINDUCTOR_CACHE_DIR"] = str(self.workdir / "inductor")
        env["TRITON_CACHE_DIR"] = str(self.workdir / "triton")
        if self.command[:1] == ["-m"] and not self.options.in_place:
            # `python -m` imports from the working directory: the user's, not the trial's temporary one.
            env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
        began = time.monotonic()
        try:
            # subprocess.run kills the trial on any exception here, Ctrl-C included.
            done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=max(limit_s, 1.0))
        except subprocess.TimeoutExpired:
            return f"stopped after {limit_s:.0f} s"
        wall = time.monotonic() - began
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return f"exit {done.returncode}: {last}"
        try:
            record = msgspec.json.decode(record_file.read_bytes(), type=TrialRecord)
            return _Trial(analyze(out, jobs=1), record, wall, out)
        except (InputError, OSError, msgspec.DecodeError) as exc:
            return f"no usable trace: {exc}"

    def left_s(self) -> float:
        return self.options.budget_s - (time.monotonic() - self.started)


def tune(command: Sequence[str], options: TuneOptions = TuneOptions(),
         progress: Callable[[str], None] = lambda line: None) -> TuneResult:
    """`command`: what follows `python` (`script.py args` or `-m module args`), paths as the user gave them.
    `progress` gets one line as each trial starts."""
    command = _absolute(list(command))
    started = time.monotonic()
    candidates: list[Candidate] = []
    combination: Optional[Candidate] = None
    interrupted = False
    noise = NOISE_FLOOR_PCT
    with tempfile.TemporaryDirectory(prefix="torchscope-tune-") as tmp:
        if options.keep is not None:
            options.keep.mkdir(parents=True, exist_ok=True)
        # A fresh folder under --keep: a run already there must not be taken for a trial's.
        outdir = Path(tempfile.mkdtemp(prefix="tune-", dir=options.keep)) if options.keep is not None else Path(tmp)
        trials = _Trials(options, command, Path(tmp), outdir)
        runs: list[_Trial] = []
        for number in range(1, max(options.baselines, 1) + 1):
            progress(f"baseline trial {number}/{max(options.baselines, 1)}")
            outcome = trials.run([], options.timeout_s)
            if isinstance(outcome, str):
                raise InputError(f"the baseline run failed ({outcome})")
            runs.append(outcome)
        baseline = runs[0]
        base_runs = [step_samples(run.report) for run in runs]
        base = [sample for samples in base_runs for sample in samples]
        noise = run_noise_pct(base_runs)
        candidates = candidates_from(baseline.report)
        candidates += requested(options.extra, candidates)
        asked = {_key(fixes) for fixes in options.extra}
        try:
            for number, candidate in enumerate(candidates, 1):
                if trials.left_s() <= 0:
                    candidate.detail = "not run: the time budget was spent"
                    continue
                if options.only and _key(candidate.fixes) not in asked:
                    candidate.detail = "not run: --only (the --try candidates alone)"
                    continue
                if all(needs_cuda(f) for f in candidate.fixes) and not baseline.report.device.present:
                    candidate.detail = "not run: it needs a CUDA device, and the baseline ran without one"
                    continue
                progress(f"trial {number}/{len(candidates)}: {candidate.fix}")
                _run_candidate(candidate, trials, baseline, base_runs)
            winners = [c for c in candidates if c.status == "faster"]
            together = combine(winners) if len(winners) > 1 else None
            # Alternatives (foreach, fused) combine to one of them: a winner already measured, no new trial.
            if together is not None and _key(together.fixes) not in {_key(w.fixes) for w in winners}:
                combination = together
                if trials.left_s() > 0:
                    progress(f"combination: {combination.fix}")
                    _run_candidate(combination, trials, baseline, base_runs)
                else:
                    combination.detail = "not run: the time budget was spent"
        except KeyboardInterrupt:
            interrupted = True
            for candidate in [*candidates, *([combination] if combination else [])]:
                if candidate.status == "skipped" and not candidate.detail:
                    candidate.detail = "not run: interrupted"
    measured = [c for c in [*candidates, combination] if c is not None and c.status == "faster"]
    best = max(measured, key=lambda c: c.speedup or 0.0, default=None)
    verdict = (f"best: {best.fix} ({best.speedup:.2f}x)" if best is not None and best.speedup is not None
               else "no candidate beats the baseline beyond noise")
    notes = [] if candidates else ["the diagnosis proposed no fix that a trial can apply without editing the code"]
    if interrupted:
        notes.append("interrupted (Ctrl-C): the trials not run are marked skipped")
    return TuneResult(
        command=command, baseline_step_us=statistics.fmean(base) if base else 0.0, baseline_steps=len(base),
        noise_pct=noise, confidence=options.confidence,
        candidates=candidates, combination=combination, best=best.fix if best else None, trials=trials.count,
        elapsed_s=time.monotonic() - started, verdict=verdict, interrupted=interrupted, notes=notes,
    )


def _absolute(command: list[str]) -> list[str]:
    """Trials run elsewhere: the script's path is made absolute (a module name is left as is)."""
    if command and command[0] != "-m" and os.path.exists(command[0]):
        return [os.path.abspath(command[0]), *command[1:]]
    return command


def candidates_from(report: Report) -> list[Candidate]:
    """The candidates of each finding, most costly finding first, duplicates dropped. A finding's fixes go
    together (persistent workers mean nothing without workers) except alternatives (`foreach` or
    `fused`): one candidate each, with the finding's other fixes; and torch.compile, a candidate of its own."""
    seen: set[tuple[tuple[str, str, str], ...]] = set()
    out = []
    for finding in report.findings:
        usable = [f for f in finding.fixes if applicable(f)]
        # torch.compile is a trial of its own: its compile time and its effect are not another fix's.
        separate = [[f] for f in usable if is_compile(f)]
        for fixes in [*_variants([f for f in usable if not is_compile(f)]), *separate]:
            key = _key(fixes)
            if not fixes or key in seen:
                continue
            seen.add(key)
            # The finding's cost is modelled for its first (preferred) fix: an alternative gets no prediction.
            preferred = not finding.fixes or finding.fixes[0] in fixes
            out.append(Candidate(
                fix=", ".join(_describe(f) for f in fixes), description=f"{finding.id}: {finding.title}", fixes=fixes,
                finding=finding.id, predicted_saving=finding.time_share if preferred else None,
            ))
    return out


def requested(extra: Sequence[Sequence[Fix]], proposed: Sequence[Candidate]) -> list[Candidate]:
    """The user's own candidates (`--try`), those the diagnosis already proposed left out."""
    seen = {_key(c.fixes) for c in proposed}
    out = []
    for fixes in extra:
        key = _key(fixes)
        if key not in seen:
            seen.add(key)
            out.append(Candidate(fix=", ".join(_describe(f) for f in fixes), fixes=list(fixes),
                                 description="asked for with --try (the diagnosis did not propose it)"))
    return out


def _key(fixes: Sequence[Fix]) -> tuple[tuple[str, str, str], ...]:
    """What a candidate sets, for spotting the same candidate twice (autocast by its dtype alone)."""
    return tuple(sorted((f.kind, f.target, autocast_dtype(f) if is_autocast(f) else repr(f.value)) for f in fixes))


def parse_try(text: str) -> tuple[Fix, ...]:
    """`num_workers=2,persistent_workers=True` (one candidate) as fixes; raises UsageError for a keyword
    a trial cannot apply. Values: integers, floats, True/False, else text."""
    fixes = []
    for item in text.split(","):
        name, sep, raw = item.strip().partition("=")
        if name in ("channels_last", "compile", "torch.compile") and not sep:  # code changes without a value
            sep, raw = "=", "True"
        if not sep or not name or not raw:
            raise UsageError(f"--try {text!r}: expected keyword=value[,keyword=value...]")
        value = _value(raw.strip())
        if name in DATALOADER_KEYWORDS:
            fix = Fix(kind="dataloader_kwarg", target=name, value=value)
        elif name in OPTIMIZER_KEYWORDS:
            fix = Fix(kind="optimizer_kwarg", target=name, value=value)
        elif name == "channels_last":
            fix = Fix(kind="code_change", target="channels_last", value="model = model.to(memory_format=torch.channels_last)")
        elif name in ("compile", "torch.compile"):
            fix = Fix(kind="code_change", target=COMPILE_TARGET, value=COMPILE_FIX)
        elif name in ("autocast", "torch.autocast"):
            fix = Fix(kind="code_change", target="torch.autocast", value=str(value))
        elif name in ("set_num_threads", "torch.set_num_threads"):
            fix = Fix(kind="torch_flag", target="torch.set_num_threads", value=value)
        else:
            fix = Fix(kind="torch_flag", target=name, value=value)
        if not applicable(fix):
            raise UsageError(f"--try {name}: not a setting a trial can apply (DataLoader: {', '.join(DATALOADER_KEYWORDS)}; "
                             f"optimizer: {', '.join(OPTIMIZER_KEYWORDS)}; autocast; channels_last; compile; set_num_threads; a torch.* flag)")
        fixes.append(fix)
    return tuple(fixes)


def _value(raw: str) -> FixValue:
    if raw in ("True", "False"):
        return raw == "True"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def _variants(fixes: list[Fix]) -> list[list[Fix]]:
    for group in ALTERNATIVES:
        chosen = [f for f in fixes if (f.kind, f.target) in group]
        if len(chosen) > 1:
            rest = [f for f in fixes if (f.kind, f.target) not in group]
            return [[*rest, f] for f in chosen]
    return [fixes]


def _describe(fix: Fix) -> str:
    if is_autocast(fix):
        return f"torch.autocast({autocast_dtype(fix)})"
    if fix.kind == "code_change":
        return str(fix.value or fix.target)
    return f"{fix.target}={fix.value!r}" if not isinstance(fix.value, str) else f"{fix.target}={fix.value}"


def run_noise_pct(runs: Sequence[Sequence[float]]) -> float:
    """Run-to-run noise of a mean step time, in percent: the spread of the baseline runs' means (the
    standard deviation; for two runs |difference| / sqrt(2)), never below diff's default floor."""
    means = [statistics.fmean(r) for r in runs if r]
    if len(means) < 2 or statistics.fmean(means) <= 0:
        return NOISE_FLOOR_PCT
    return max(NOISE_FLOOR_PCT, 100.0 * statistics.stdev(means) / statistics.fmean(means))


def _run_candidate(candidate: Candidate, trials: _Trials, baseline: _Trial, base_runs: list[list[float]]) -> None:
    """One trial of the candidate; while the answer is within noise, up to `repeats` trials in all (each
    one more run: a narrower interval and the candidate's own run-to-run spread; a clear answer needs no
    repeat)."""
    runs: list[list[float]] = []
    first: Optional[_Trial] = None
    for _ in range(max(trials.options.repeats, 1)):
        if first is not None and (candidate.status != "no significant change" or trials.left_s() <= 0):
            break
        allowance = trials.options.compile_allowance_s if any(is_compile(f) for f in candidate.fixes) else 0.0
        limit = min(trials.options.early_stop * baseline.wall_s + allowance, trials.options.timeout_s)
        budget = trials.left_s()
        trial = trials.run(candidate.fixes, min(limit, budget))
        if isinstance(trial, str):
            if first is None:
                _no_measurement(candidate, trial, budget < limit, baseline.wall_s, trials.options.early_stop)
            break
        first = first or trial
        runs.append(step_samples(trial.report))
        candidate.trial_s = (candidate.trial_s or 0.0) + trial.wall_s
        measure(candidate, base_runs, runs, confidence=trials.options.confidence)
    if first is None:
        return
    candidate.applied_at = sorted({s for f in candidate.fixes for s in first.record.sites.get(label(f), [])})
    after = next((f for f in first.report.findings if f.id == candidate.finding), None)
    candidate.finding_after = after.time_share if after is not None else None
    candidate.loss_change = loss_change(baseline.record.losses, first.record.losses)
    candidate.compile_s = first.record.compile_s
    if trials.options.keep is not None:
        candidate.trial_dir = str(first.out)
    if not candidate.applied_at:
        candidate.status = "not applied"
        candidate.detail = "no call in the script took this fix (nothing to change), so the measurement says nothing about it"
    elif candidate.loss_change is not None and not abs(candidate.loss_change) <= trials.options.loss_tolerance:
        candidate.status = "loss changed"
        candidate.detail = (f"mean loss moved {_pct(candidate.loss_change)} from the baseline's (tolerance "
                            f"{100 * trials.options.loss_tolerance:g} %): not used")
    elif candidate.status == "faster":
        candidate.change = code_change(candidate.fixes, first.record.sites)


def _no_measurement(candidate: Candidate, why: str, budget_ran_out: bool, baseline_s: float, early_stop: float) -> None:
    if why.startswith("stopped after") and budget_ran_out:
        candidate.detail = f"not finished: the time budget ran out ({why})"
    elif why.startswith("stopped after"):
        candidate.status = "slower"
        candidate.detail = f"stopped early, clearly slower: {why}, over {early_stop:g}x the baseline trial's {baseline_s:.0f} s"
    else:
        candidate.status, candidate.detail = "failed", why


def _pct(change: float) -> str:
    return f"{100 * change:+.1f} %" if math.isfinite(change) else "to NaN/inf"


def measure(candidate: Candidate, base_runs: Sequence[Sequence[float]], runs: Sequence[Sequence[float]],
            confidence: float = 0.95) -> None:
    """Speed-up of the candidate's runs (each a list of per-step times) over the baseline's, with its
    interval: runs are the unit (pipeline/noise.run_level_interval), at least NOISE_FLOOR_PCT apart."""
    interval = run_level_interval(base_runs, runs, confidence, run_noise_pct=NOISE_FLOOR_PCT)
    samples = [s for run in runs for s in run]
    candidate.step_us = statistics.fmean(samples) if samples else None
    candidate.speedup = 1.0 / (1.0 + interval.change_pct / 100.0) if interval.change_pct > -100 else None
    if interval.low_pct is not None and interval.high_pct is not None:
        # The interval of the change maps to one of the speed-up; a bound at or past -100 % is unbounded.
        candidate.ci_low = 1.0 / (1.0 + interval.high_pct / 100.0) if interval.high_pct > -100 else None
        candidate.ci_high = 1.0 / (1.0 + interval.low_pct / 100.0) if interval.low_pct > -100 else None
    candidate.significant = interval.significant
    candidate.measured_saving = -interval.change_pct / 100.0
    candidate.status = ("faster" if interval.change_pct < 0 else "slower") if interval.significant else "no significant change"
    candidate.detail = interval.method


def loss_change(base: Sequence[Optional[float]], trial: Sequence[Optional[float]]) -> Optional[float]:
    """Mean loss of the trial over the baseline's, minus 1, over the backward passes both made (None: no
    loss seen). A non-finite loss where the baseline's were finite is an infinite change."""
    n = min(len(base), len(trial))
    if n == 0:
        return None
    if any(v is None for v in base[:n]):
        return None  # the baseline itself diverged: nothing to hold the trial to
    if any(v is None for v in trial[:n]):
        return math.inf
    b = statistics.fmean(v for v in base[:n] if v is not None)
    t = statistics.fmean(v for v in trial[:n] if v is not None)
    if b == 0:
        return 0.0 if t == 0 else math.inf
    return t / b - 1.0


def combine(winners: list[Candidate]) -> Candidate:
    """The winners' fixes together. Where two set the same keyword, or keywords that exclude each other,
    the faster candidate's fix is kept. Predicted saving: the findings' savings compounded."""
    chosen: dict[tuple[str, str], Fix] = {}
    for candidate in sorted(winners, key=lambda c: c.speedup or 0.0):
        for fix in candidate.fixes:
            key = (fix.kind, fix.target)
            for group in ALTERNATIVES:
                if key in group:
                    for other in group - {key}:
                        chosen.pop(other, None)
            chosen[key] = fix
    fixes = list(chosen.values())
    kept = 1.0
    for candidate in winners:
        kept *= 1.0 - (candidate.predicted_saving or 0.0)
    return Candidate(fix=", ".join(_describe(f) for f in fixes), description="the faster candidates together",
                     fixes=fixes, predicted_saving=1.0 - kept)
