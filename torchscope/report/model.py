"""The Report: one JSON document, a stable contract (later versions add fields, never remove them).

All types are msgspec structs so that a Report encodes to JSON and decodes back (with defaults for fields
an older writer did not know) without hand-written (de)serialisers. Times are microseconds; shares are
fractions 0..1 unless a field name says `percent`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

import msgspec

SCHEMA_VERSION = 1

Severity = Literal["critical", "warning", "info"]
Category = Literal[
    "data_loading",
    "compute",
    "host_overhead",
    "optimizer",
    "outside_steps",
    "synchronization",
    "h2d_copy",
    "idle",
    "communication",
    "straggler",
    "memory",
    "trace_quality",
]
CATEGORIES: tuple[str, ...] = Category.__args__  # type: ignore[attr-defined]


class CategoryTime(msgspec.Struct, kw_only=True):
    us: float
    percent: float


class StepRow(msgspec.Struct, kw_only=True):
    step: int
    rank: int
    span: int = 0
    start_us: float = 0.0
    duration_us: float
    breakdown: dict[str, float]
    phases: dict[str, float] = {}


class OperatorRow(msgspec.Struct, kw_only=True):
    name: str
    calls: int
    host_self_us: float
    host_total_us: float
    device_self_us: float = 0.0
    device_total_us: float = 0.0
    input_shapes: Optional[str] = None  # set in the by-shape table


class KernelRow(msgspec.Struct, kw_only=True):
    name: str
    calls: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    mean_occupancy_pct: Optional[float] = None
    mean_blocks_per_sm: Optional[float] = None
    tensor_core: bool = False
    launched_by: str = ""


class RangeRow(msgspec.Struct, kw_only=True):
    name: str
    calls: int
    total_us: float
    mean_us: float


class DeviceSummary(msgspec.Struct, kw_only=True):
    present: bool = False
    name: str = ""
    compute_capability: Optional[str] = None
    total_memory_bytes: Optional[int] = None
    utilization: Optional[float] = None
    sm_efficiency: Optional[float] = None
    achieved_occupancy_pct: Optional[float] = None
    tensor_core_kernel_share: Optional[float] = None
    tensor_core_eligible_share: Optional[float] = None
    kernels_per_step: float = 0.0
    median_kernel_us: Optional[float] = None


class MemorySummary(msgspec.Struct, kw_only=True):
    present: bool = False
    peak_allocated_bytes: dict[str, int] = {}
    peak_reserved_bytes: dict[str, int] = {}
    timeline: dict[str, list[list[float]]] = {}  # device -> [[t_us_from_start, allocated_bytes], ...]


class RankSummary(msgspec.Struct, kw_only=True):
    rank: int
    worker: str
    files: list[str]
    steps: int
    mean_step_us: float
    median_step_us: float
    breakdown_us: dict[str, float]
    comm_us_per_step: float = 0.0
    compute_us_per_step: float = 0.0


class SpanSummary(msgspec.Struct, kw_only=True):
    rank: int
    file: str
    steps: list[int]
    mean_step_us: float
    breakdown: dict[str, CategoryTime]


class Finding(msgspec.Struct, kw_only=True):
    id: str
    category: Category
    severity: Severity
    title: str
    evidence: dict[str, Any]
    time_share: Optional[float]
    recommendation: str


class RunInfo(msgspec.Struct, kw_only=True):
    paths: list[str]
    trace_files: list[str]
    ranks: list[int]
    device_kind: Literal["cpu", "cuda", "rocm", "other"]
    step_source: str = "profiler_step"
    manifest: dict[str, Any] = {}
    partial: bool = False


class Report(msgspec.Struct, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    torchscope_version: str
    run: RunInfo
    steps: list[StepRow]
    breakdown: dict[str, CategoryTime]
    phases: dict[str, CategoryTime] = {}
    operators: list[OperatorRow] = []
    operators_by_shape: list[OperatorRow] = []
    kernels: list[KernelRow] = []
    ranges: list[RangeRow] = []
    device: DeviceSummary = msgspec.field(default_factory=DeviceSummary)
    memory: MemorySummary = msgspec.field(default_factory=MemorySummary)
    ranks: list[RankSummary] = []
    spans: list[SpanSummary] = []
    signals: dict[str, Any] = {}
    findings: list[Finding] = []
    warnings: list[str] = []


def encode_report(report: Report) -> bytes:
    return msgspec.json.encode(report)


def decode_report(data: bytes) -> Report:
    return msgspec.json.decode(data, type=Report)
