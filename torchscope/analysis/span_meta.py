"""What the pipeline itself needs to know of each span: where it starts, which rank wrote it, how many
steps it holds and how long they take (the weights of run-level means), its device kind and warnings."""

from __future__ import annotations

from typing import Any, Literal, Optional

import msgspec
import numpy as np

from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.analysis.step_kinds import evaluation_action_mask
from torchscope.rundir.manifest import StepSource
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

DeviceKind = Literal["cpu", "cuda", "rocm"]


class SpanMeta(msgspec.Struct, kw_only=True):
    file: str
    first_ts_us: float
    last_ts_us: float = 0.0  # the end of its last event
    header_rank: Optional[int]  # distributedInfo.rank of the trace header, when it has one
    steps: int
    step_us: float
    has_device: bool
    device_kind: DeviceKind
    step_source: StepSource
    warnings: list[str]
    # The process that wrote the trace (its host ops' pid and the header's host_name, when written), and
    # whether its steps train (a backward or an optimizer step in them): two files of one process are one
    # rank, and a rank's spans that only run forward beside spans that train are evaluation.
    host: Optional[str] = None
    pid: Optional[str] = None
    trains: bool = True
    evaluation_steps: int = 0  # steps left out as evaluation beside training ones (analysis/step_kinds.py)
    evaluation_us: float = 0.0


def extract_meta(span: SpanInput) -> SpanMeta:
    events = span.events
    info = span.header.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    host = span.header.get("host_name")
    return SpanMeta(
        host=host if isinstance(host, str) and host else None,
        pid=_host_pid(events),
        trains=_trains(span),
        evaluation_steps=span.steps.evaluation_steps,
        evaluation_us=span.steps.evaluation_us,
        file=span.file,
        first_ts_us=float(events.ts_us.min()) if len(events) else 0.0,
        last_ts_us=float((events.ts_us + events.dur_us).max()) if len(events) else 0.0,
        header_rank=int(rank) if isinstance(rank, int) and not isinstance(rank, bool) else None,
        steps=len(span.steps),
        step_us=float(span.steps.duration_us.sum()),
        has_device=span.has_device,
        device_kind=_device_kind(span),
        step_source=span.steps.source,
        warnings=list(span.trace.warnings),
    )


def _host_pid(events: EventTable) -> Optional[str]:
    """The pid of most host ops (device events carry the device's id there), as written."""
    ops = events.pid[events.kind_rows(Kind.CPU_OP)]
    if ops.size == 0:
        return None
    return str(events.strings[int(np.argmax(np.bincount(ops)))])


def _trains(span: SpanInput) -> bool:
    """Whether the steps hold backward or optimizer time, unless an evaluation action says otherwise
    (analysis/step_kinds.py: no backward alone is no evidence, an RL rollout is training's cost)."""
    phases = span.phase_breakdown
    columns = [i for i, name in enumerate(phases.categories) if name in ("backward", "optimizer")]
    if len(span.steps) == 0 or bool(phases.per_step_us[:, columns].sum() > 0):
        return True
    return not evaluation_action_mask(span.events).any()


def _device_kind(span: SpanInput) -> DeviceKind:
    if not span.has_device:
        return "cpu"
    events = span.events
    name = span.device.summary.name
    hip_calls = events.name_mask(_is_hip_call, events.kind_rows(Kind.RUNTIME))  # the runtime calls only
    if hip_calls.any() or "AMD" in name or "Radeon" in name or "Instinct" in name:
        return "rocm"
    return "cuda"


def _is_hip_call(name: str) -> bool:
    return name.startswith("hip")


def _no_fields(parts: list[Part[Any]]) -> dict[str, Any]:
    return {}  # the pipeline reads the metas itself (RunInfo, ranks, weights)


META = Analysis(name="span", extract=extract_meta, extract_type=SpanMeta, reduce=_no_fields)
