"""Hand-built Reports for the rule tests (test_rules_*.py): only the fields a rule reads, every other
field at its default. No trace is parsed, so each test states the measurements its rule sees."""

from __future__ import annotations

from typing import Any, Optional

from torchscope.diagnose.engine import diagnose
from torchscope.report.measurements import Measurements
from torchscope.report.model import (
    CategoryTime,
    DeviceSummary,
    Finding,
    KernelRow,
    MemorySummary,
    OperatorRow,
    RankSummary,
    Report,
    RunInfo,
    StepRow,
    StepSource,
)

STEP_US = 10_000.0
STEPS = 4
FIRST_STEP = 5  # past the warm-up steps 0 and 1, so trace_quality.warmup_in_window stays quiet


def shares(step_us: float = STEP_US, **by_category: float) -> dict[str, CategoryTime]:
    """Breakdown or phase entries from shares of the step."""
    return {name: CategoryTime(us=share * step_us, percent=100.0 * share) for name, share in by_category.items()}


def gpu(**fields: Any) -> DeviceSummary:
    """A present A100-like device; `fields` override (utilization, tensor-core shares, ...)."""
    base: dict[str, Any] = {"present": True, "name": "NVIDIA A100", "compute_capability": "8.0", "total_memory_bytes": 80 * 2**30}
    return DeviceSummary(**{**base, **fields})


def report(
    *,
    measurements: Optional[Measurements] = None,
    breakdown: Optional[dict[str, float]] = None,
    phases: Optional[dict[str, float]] = None,
    device: Optional[DeviceSummary] = None,
    steps: int = STEPS,
    step_us: float = STEP_US,
    durations: Optional[list[float]] = None,
    first_step: int = FIRST_STEP,
    step_source: StepSource = "profiler_step",
    manifest: Optional[dict[str, Any]] = None,
    kernels: Optional[list[KernelRow]] = None,
    operators: Optional[list[OperatorRow]] = None,
    ranks: Optional[list[RankSummary]] = None,
    memory: Optional[MemorySummary] = None,
    partial: bool = False,
    warnings: Optional[list[str]] = None,
) -> Report:
    """A minimal Report: `steps` steps of `step_us` (or `durations`), shares for breakdown and phases."""
    durations = durations if durations is not None else [step_us] * steps
    device = device or DeviceSummary()
    return Report(
        torchscope_version="test",
        run=RunInfo(
            paths=[],
            trace_files=[],
            ranks=[0],
            device_kind="cuda" if device.present else "cpu",
            step_source=step_source,
            manifest=manifest or {},
            partial=partial,
        ),
        steps=[StepRow(step=first_step + i, rank=0, duration_us=d, breakdown={}) for i, d in enumerate(durations)],
        breakdown=shares(step_us, **(breakdown or {})),
        phases=shares(step_us, **(phases or {})),
        device=device,
        measurements=measurements or Measurements(),
        kernels=kernels or [],
        operators=operators or [],
        ranks=ranks or [],
        memory=memory or MemorySummary(),
        warnings=warnings or [],
    )


def findings(rep: Report) -> dict[str, Finding]:
    """The report's findings by id (the engine's full run: verdicts, caps and ranking included)."""
    return {f.id: f for f in diagnose(rep)}


def finding(rep: Report, finding_id: str) -> Finding:
    """The one finding `finding_id`, failing with the ids found when it is missing."""
    found = findings(rep)
    assert finding_id in found, sorted(found)
    return found[finding_id]


def fixes(f: Finding) -> dict[str, Any]:
    """A finding's fixes as {target: (kind, value)}."""
    return {fix.target: (fix.kind, fix.value) for fix in f.fixes}
