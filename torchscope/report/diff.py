"""The diff of two runs (`torchscope diff BASE NEW`): one JSON document, like the Report a stable contract.

Every change carries the two values, the relative change and, where the runs give per-step samples, a
confidence interval for it and whether it is beyond noise; `verdict` says it in words. Times are
microseconds per step; `change_pct` is relative to the base; `pp` fields are percentage points.
"""

from __future__ import annotations

from typing import Literal, Optional

import msgspec

from torchscope.report.model import Direction, Unit

DIFF_SCHEMA_VERSION = 1

StepVerdict = Literal["faster", "slower", "no significant change"]
MetricVerdict = Literal["better", "worse", "no significant change", "not comparable"]


class StepTimeChange(msgspec.Struct, kw_only=True):
    """Mean step time of the two runs and the change, with its confidence interval (see `method`)."""

    base_us: float
    new_us: float
    change_pct: float
    ci_low_pct: Optional[float]
    ci_high_pct: Optional[float]
    significant: bool
    verdict: StepVerdict
    base_steps: int
    new_steps: int
    base_median_us: float
    new_median_us: float
    base_stdev_us: float
    new_stdev_us: float
    method: str  # how the interval was computed, or why none could be
    confidence: float = 0.95


class MetricChange(msgspec.Struct, kw_only=True):
    """One metric of both Reports (report.metrics), compared in its own direction."""

    name: str
    unit: Unit
    better: Direction
    base: Optional[float]
    new: Optional[float]
    change_pct: Optional[float]
    ci_low_pct: Optional[float] = None
    ci_high_pct: Optional[float] = None
    significant: bool = False
    verdict: MetricVerdict = "no significant change"


class CategoryChange(msgspec.Struct, kw_only=True):
    """A breakdown category: time per step and share of the step in both runs."""

    category: str
    base_us: float
    new_us: float
    base_percent: float
    new_percent: float
    change_pp: float  # share of the step, percentage points
    change_us: float


class RowChange(msgspec.Struct, kw_only=True):
    """An operator (name, input shapes, call site: the key it is matched on; pipeline/diff.py
    `operator_keys`) or kernel (name; `launched_by` shown, not matched on): time per step in both runs;
    absent in one run = 0."""

    name: str
    input_shapes: Optional[str] = None
    call_site: Optional[str] = None  # "func (file.py:42)", "(other call sites)"; None: not split by site
    launched_by: Optional[str] = None  # kernels: the operator that launches it most often
    base_us_per_step: float
    new_us_per_step: float
    change_us_per_step: float
    base_calls_per_step: float
    new_calls_per_step: float
    status: Literal["changed", "added", "removed"]


class FindingChange(msgspec.Struct, kw_only=True):
    id: str
    title: str
    status: Literal["appeared", "disappeared", "changed", "unchanged"]
    base_share: Optional[float]
    new_share: Optional[float]
    base_severity: Optional[str]
    new_severity: Optional[str]


class RunRef(msgspec.Struct, kw_only=True):
    """Which run a side of the diff is, as given on the command line."""

    path: str
    schema_version: int
    torchscope_version: str
    device_kind: str
    ranks: list[int]
    steps: int


class GateResult(msgspec.Struct, kw_only=True):
    """The regression gate's answer: failed when a change is beyond both noise and its threshold."""

    failed: bool
    checks: list[str]  # each threshold checked, in words, with its outcome
    explanation: str


class ReportDiff(msgspec.Struct, kw_only=True):
    schema_version: int = DIFF_SCHEMA_VERSION
    base: RunRef
    new: RunRef
    step_time: StepTimeChange
    breakdown: list[CategoryChange]
    phases: list[CategoryChange]
    metrics: list[MetricChange]
    operators: list[RowChange]
    kernels: list[RowChange]
    findings: list[FindingChange]
    warnings: list[str] = []
    gate: Optional[GateResult] = None


def encode_diff(diff: ReportDiff) -> bytes:
    return msgspec.json.encode(diff)


def decode_diff(data: bytes) -> ReportDiff:
    return msgspec.json.decode(data, type=ReportDiff)
