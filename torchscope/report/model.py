"""The Report: one JSON document, a stable contract (later versions add fields, never remove them).

All types are msgspec structs so that a Report encodes to JSON and decodes back (with defaults for fields
an older writer did not know) without hand-written (de)serialisers. Times are microseconds; shares are
fractions 0..1 unless a field name says `percent`.

Version 2 replaced version 1's untyped `signals` with typed `measurements` (report/measurements.py), and
added `metrics` (report/metrics.py), `findings[].fixes` and `extra`. `decode_report` reads both versions.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

import msgspec

from torchscope.report.distributed import Distributed
from torchscope.report.measurements import SECTION_TYPES, Measurements
from torchscope.rundir.manifest import StepSource

SCHEMA_VERSION = 2

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
    flops: Optional[float] = None  # total over the calls, from input shapes (matmul family); None: unknown

    @property
    def achieved_flops_per_s(self) -> Optional[float]:
        """FLOP/s over the op's time: its device time where it launched device work, else its host time."""
        seconds = (self.device_total_us or self.host_total_us) / 1e6
        return self.flops / seconds if self.flops is not None and seconds > 0 else None


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


class ModuleRow(msgspec.Struct, kw_only=True):
    """Time per ``nn.Module`` path (forward calls), means per step (analysis/modules.py)."""

    path: str  # e.g. "Sequential_0/Linear_1": class and instance number per level, outermost first
    module: str  # the class name
    depth: int
    calls: int  # over every recorded step
    calls_per_step: float
    host_us_per_step: float  # inclusive
    host_self_us_per_step: float  # less its child modules
    device_us_per_step: float = 0.0  # kernels launched inside it, inclusive


class CallSiteRow(msgspec.Struct, kw_only=True):
    """Where a top operator is called from: the innermost frame of the user's code, and the user's call
    stack above the op (analysis/callsites.py)."""

    operator: str
    site: str  # "func (file.py:42)"
    calls: int
    host_self_us: float  # totals over the whole trace, as in the operator table
    device_self_us: float = 0.0
    stack: list[str] = []  # the user's frames, outermost first, ending with `site`; the costliest path where several reach it
    stack_share: float = 0.0  # that path's part of the row's self time (0 without a stack)


class DeviceSummary(msgspec.Struct, kw_only=True):
    present: bool = False
    name: str = ""
    compute_capability: Optional[str] = None
    total_memory_bytes: Optional[int] = None  # the first device's (deviceProperties[0])
    memory_bytes_by_id: dict[int, int] = {}  # every device's totalGlobalMem by its id (the smallest over ranks)
    utilization: Optional[float] = None
    sm_efficiency: Optional[float] = None
    achieved_occupancy_pct: Optional[float] = None
    tensor_core_kernel_share: Optional[float] = None
    tensor_core_eligible_share: Optional[float] = None
    kernels_per_step: float = 0.0
    median_kernel_us: Optional[float] = None


class MemoryPeak(msgspec.Struct, kw_only=True):
    """One device's allocated peak: when it happens and what is alive then (analysis/memory.py).

    `alive_by_*` count blocks allocated inside the trace and not yet freed at the peak (paired by `Addr`);
    `unattributed_bytes` is the rest of the peak (blocks allocated before the capture, or a trace without
    `Addr`). `step` is the step number (None: outside the steps)."""

    allocated_bytes: int
    reserved_bytes: Optional[int] = None
    t_us: float = 0.0
    origin_us: float = 0.0  # the trace time (its rank's clock) that t_us counts from: links to the timeline
    rank: int = 0
    step: Optional[int] = None
    phase: str = ""
    operator: str = ""
    call_site: str = ""
    alive_by_operator: dict[str, int] = {}
    alive_by_call_site: dict[str, int] = {}
    unattributed_bytes: int = 0


class MemoryStepRow(msgspec.Struct, kw_only=True):
    """Allocator traffic of one device inside one step: churn (allocated and freed) and what it keeps."""

    device: str
    step: int
    rank: int = 0
    allocated_at_start_bytes: int = 0
    allocated_at_end_bytes: int = 0
    alloc_bytes: int = 0
    alloc_count: int = 0
    free_bytes: int = 0
    free_count: int = 0
    temporary_bytes: int = 0  # allocated and freed inside the step (needs `Addr`)


class MemoryGrowth(msgspec.Struct, kw_only=True):
    """Allocated memory at step boundaries as a line: Theil-Sen slope with its 90 % interval (pairwise
    slopes' quantiles), the least-squares fit's R^2, and the call sites whose blocks outlive their step."""

    bytes_per_step: float = 0.0
    low_bytes_per_step: float = 0.0
    high_bytes_per_step: float = 0.0
    r2: float = 0.0
    boundaries: int = 0
    surviving_by_call_site: dict[str, int] = {}  # bytes per step allocated in a step and alive at its end
    # Frees the trace lacks (memory_blocks.py): blocks allocated again at an address still held, and the
    # bytes per step of never-freed blocks perhaps freed unseen (of such a size, or a collective's buffer),
    # left out of surviving_by_call_site.
    unrecorded_frees: int = 0
    doubtful_bytes_per_step: float = 0.0
    # The line the leak rule judges: the same as above, unless the allocator's total counts only the events
    # it reported (c10's CPU allocator) and doubtful blocks were taken off it.
    leak_bytes_per_step: float = 0.0
    leak_low_bytes_per_step: float = 0.0
    leak_r2: float = 0.0


class MemorySummary(msgspec.Struct, kw_only=True):
    present: bool = False
    peak_allocated_bytes: dict[str, int] = {}
    peak_reserved_bytes: dict[str, int] = {}
    timeline: dict[str, list[list[float]]] = {}  # device -> [[t_us_from_start, allocated_bytes], ...]
    reserved_timeline: dict[str, list[list[float]]] = {}  # device -> [[t_us_from_start, reserved_bytes], ...]
    timeline_origin_us: dict[str, float] = {}  # device -> the trace time its timelines count from ("start")
    timeline_rank: dict[str, int] = {}  # device -> the rank its timelines come from
    peaks: dict[str, MemoryPeak] = {}
    per_step: list[MemoryStepRow] = []
    growth: dict[str, MemoryGrowth] = {}
    has_addresses: bool = False  # events carried `Addr` (PyTorch >= 1.10): blocks pair with their frees
    unpaired_allocations: int = 0  # allocated inside the trace, never freed in it
    unpaired_frees: int = 0  # freed inside the trace, allocated before it


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


FixKind = Literal["env_var", "torch_flag", "dataloader_kwarg", "optimizer_kwarg", "profiler_option", "code_change"]
FixValue = Union[bool, int, float, str, None]


class Fix(msgspec.Struct, kw_only=True, frozen=True):
    """One concrete change a finding recommends, as data (what `tune` can apply and measure).

    `kind` says where the change goes and `target` what it sets: an environment variable
    (`PYTORCH_CUDA_ALLOC_CONF`), a torch flag (`torch.backends.cudnn.benchmark`), a DataLoader or optimizer
    keyword (`num_workers`, `foreach`), a profiler option, or a code change that no setting makes (then
    `target` names the construct, e.g. `torch.compile`). `value` is what to set (None: to be chosen)."""

    kind: FixKind
    target: str
    value: FixValue = None
    summary: str = ""


class Finding(msgspec.Struct, kw_only=True):
    """One diagnosed problem. `time_share` is the estimated share of the step a fix would save (None: no
    time cost), within `time_share_low`..`time_share_high` (equal to it where no range is modelled)."""

    id: str
    category: Category
    severity: Severity
    title: str
    evidence: dict[str, Any]
    time_share: Optional[float]
    recommendation: str
    fixes: list[Fix] = []
    time_share_low: Optional[float] = None
    time_share_high: Optional[float] = None


Direction = Literal["lower", "higher", "none"]
Unit = Literal["us", "bytes", "percent", "fraction", "count", "per_second", "gbps"]


class Metric(msgspec.Struct, kw_only=True, frozen=True):
    """One run-level figure with its unit and which direction is better (for diff, gates and tune)."""

    name: str
    value: float
    unit: Unit
    better: Direction


class RunInfo(msgspec.Struct, kw_only=True):
    paths: list[str]
    trace_files: list[str]
    ranks: list[int]
    device_kind: Literal["cpu", "cuda", "rocm", "other"]
    step_source: StepSource = "profiler_step"
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
    modules: list[ModuleRow] = []
    call_sites: list[CallSiteRow] = []
    device: DeviceSummary = msgspec.field(default_factory=DeviceSummary)
    memory: MemorySummary = msgspec.field(default_factory=MemorySummary)
    ranks: list[RankSummary] = []
    spans: list[SpanSummary] = []
    distributed: Distributed = msgspec.field(default_factory=Distributed)  # across ranks (report/distributed.py)
    measurements: Measurements = msgspec.field(default_factory=Measurements)
    metrics: list[Metric] = []
    findings: list[Finding] = []
    warnings: list[str] = []
    extra: dict[str, Any] = {}  # results of analyses registered outside torchscope, by analysis name

    @property
    def mean_step_us(self) -> float:
        """Mean step duration over every step of every rank (0 without steps)."""
        return sum(s.duration_us for s in self.steps) / len(self.steps) if self.steps else 0.0


def encode_report(report: Report) -> bytes:
    return msgspec.json.encode(report)


def decode_report(data: bytes) -> Report:
    """A Report from its JSON, version 1 or 2 (version 1's `signals` become `measurements`)."""
    document = msgspec.json.decode(data)
    if isinstance(document, dict) and document.get("schema_version", 1) == 1:
        document = upgrade_v1(document)
    # Not strict: JSON object keys are text, and dicts keyed by int (device ids) read them back as ints.
    return msgspec.convert(document, type=Report, strict=False)


# Version 1 `signals` keys that moved within their section in version 2: (v1 group, v1 key) -> (section, key).
_V1_MOVED = {
    ("outside_steps", None): ("outside_steps", "culprits_us_per_step"),
    ("idle_host_ops", None): ("idle", "host_ops_us_per_step"),
    ("idle_us_per_step", None): ("idle", "idle_us_per_step"),
    ("idle_explained_us_per_step", None): ("idle", "explained_us_per_step"),
}


def upgrade_v1(document: dict[str, Any]) -> dict[str, Any]:
    """A version-1 report document in the version-2 layout (figures kept, untyped extras dropped)."""
    signals = document.get("signals") or {}
    measurements: dict[str, dict[str, Any]] = {}
    for group, value in signals.items() if isinstance(signals, dict) else ():
        moved = _V1_MOVED.get((group, None))
        if moved is not None:
            measurements.setdefault(moved[0], {})[moved[1]] = value
        elif group in SECTION_TYPES and isinstance(value, dict):
            fields = {f.name for f in msgspec.structs.fields(SECTION_TYPES[group])}
            measurements.setdefault(group, {}).update({k: v for k, v in value.items() if k in fields})
    upgraded = {k: v for k, v in document.items() if k != "signals"}
    upgraded["measurements"] = measurements
    upgraded["schema_version"] = SCHEMA_VERSION
    return upgraded
