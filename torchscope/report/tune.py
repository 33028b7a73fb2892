"""The result of `torchscope tune`: each candidate fix measured against the baseline, then the best
combination; a JSON contract like the Report's (speed-up = baseline step time / trial step time)."""

from __future__ import annotations

from typing import Literal, Optional

import msgspec

from torchscope.report.model import Fix

TUNE_SCHEMA_VERSION = 1

TrialStatus = Literal["faster", "slower", "no significant change", "failed", "skipped"]


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
    detail: str = ""


class TuneResult(msgspec.Struct, kw_only=True):
    schema_version: int = TUNE_SCHEMA_VERSION
    command: list[str]
    baseline_step_us: float
    baseline_steps: int
    candidates: list[Candidate]
    combination: Optional[Candidate] = None
    trials: int
    elapsed_s: float
    verdict: str
    notes: list[str] = []
