"""The result of `torchscope tune`: each candidate fix measured against the baseline, then the best
combination; a JSON contract like the Report's (speed-up = baseline step time / trial step time)."""

from __future__ import annotations

from typing import Literal, Optional

import msgspec

from torchscope.report.model import Fix

TUNE_SCHEMA_VERSION = 1

# faster/slower/no significant change: measured; failed: the trial exited with an error or left no trace;
# not applied: no call in the script took the fix (no DataLoader, an optimizer without the keyword);
# loss changed: the loss moved beyond tolerance (not used, whatever its speed); skipped: not run (budget,
# Ctrl-C).
TrialStatus = Literal["faster", "slower", "no significant change", "failed", "not applied", "loss changed", "skipped"]


class Candidate(msgspec.Struct, kw_only=True):
    fix: str  # the fixes in one line, e.g. "num_workers=2, persistent_workers=True"
    description: str  # where it comes from (the finding) and what it changes
    fixes: list[Fix]
    finding: Optional[str] = None
    step_us: Optional[float] = None
    speedup: Optional[float] = None
    ci_low: Optional[float] = None
    ci_high: Optional[float] = None
    significant: bool = False
    status: TrialStatus = "skipped"
    predicted_saving: Optional[float] = None  # the finding's time_share: what the diagnosis expected
    measured_saving: Optional[float] = None  # 1 - trial / baseline step time
    applied_at: list[str] = []  # file:line of each call the fix changed ("process-wide" for a flag)
    loss_change: Optional[float] = None  # mean loss of the trial relative to the baseline's, minus 1
    finding_after: Optional[float] = None  # the finding's time_share in the trial (None: no longer diagnosed)
    change: list[str] = []  # the code change to make, diff-like ("- old", "+ new") where the call site is known
    trial_s: Optional[float] = None  # wall time of the trial process
    # torch.compile: seconds spent compiling (the first compiled forward's and backward's excess over the
    # later ones'), kept out of step_us and speedup, which count the steady-state steps only
    compile_s: Optional[float] = None
    trial_dir: Optional[str] = None  # the trial's capture, where kept (`tune --keep DIR`)
    detail: str = ""


class TuneResult(msgspec.Struct, kw_only=True):
    schema_version: int = TUNE_SCHEMA_VERSION
    command: list[str]
    baseline_step_us: float
    baseline_steps: int  # over all baseline trials
    noise_pct: float  # run-to-run noise of the mean step time, from the baseline trials' spread (floor 2 %)
    confidence: float = 0.95  # of each candidate's ci_low/ci_high
    candidates: list[Candidate]
    combination: Optional[Candidate] = None
    best: Optional[str] = None  # `fix` of the fastest candidate or the combination; None: none beat the baseline
    trials: int
    elapsed_s: float
    verdict: str
    interrupted: bool = False
    notes: list[str] = []
