"""Per-span extraction of collective instances, for matching across ranks (analysis/distributed.py).

Which events time a collective on a rank, in order of preference:

* `kernel`: NCCL/RCCL kernels on the device (GPU traces): they run from the moment the collective can
  start on that GPU until every peer has taken part, so their length is transfer plus waiting.
* `backend`: the backend's own range (`gloo:all_reduce`, `nccl:all_reduce`, `mpi:`, `ucc:`): gloo runs
  the collective on its worker thread inside it.
* `record_param_comms`: the c10d op's parameter record (it carries the collective name, process group,
  sizes and, in recent PyTorch, the sequence number `Seq`).
* `c10d`: the dispatcher op (`c10d::allreduce_`), when nothing else is there.

Instances are keyed by process group and sequence number where the trace has them (from
`record_param_comms` with `Seq`, matched in order of occurrence to the timed events of the same group and
collective); otherwise by step, group, collective and order of occurrence within the step.
The extract is compact: flat arrays of instances, no events.
"""

from __future__ import annotations

import re
from typing import Optional

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import is_measurement_frame
from torchscope.analysis.host import encloses, encloses_markers  # shared with outside_phases
from torchscope.analysis.markers import COMM_OP_PREFIXES, HOST_RANGES, comm_kernel_mask, own_marker_mask
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import StepWindows, step_marker_mask
from torchscope.arrays import distinct as distinct_values  # np.unique imports numpy.ma
from torchscope.arrays import group_ids
from torchscope.trace.kinds import DEVICE_KINDS, Kind, kind_mask
from torchscope.trace.tables import EventTable

BACKEND_PREFIXES = tuple(p for p in COMM_OP_PREFIXES if p != "c10d::")
PHASES = ("data_loading", "forward", "backward", "optimizer", "other")
_KERNEL_COLLECTIVE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
_SUFFIXES = ("_into_tensor", "_coalesced", "_base", "_tensor")
_CANONICAL = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "barrier": "barrier",
    "send": "send_recv", "recv": "send_recv", "sendrecv": "send_recv", "recvanysource": "send_recv",
    "gather": "gather", "scatter": "scatter", "reduce": "reduce", "monitoredbarrier": "barrier",
}
CULPRITS_PER_PHASE = 15


def collective_name(raw: str) -> str:
    """The collective a backend range, c10d op, kernel or `Collective name` arg stands for, one spelling
    for all (`all_reduce`); point-to-point send and recv are one `send_recv` so a send matches its recv."""
    name = raw
    if match := _KERNEL_COLLECTIVE.match(raw):
        name = match[1]
    else:
        for prefix in (*COMM_OP_PREFIXES, "nccl::"):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
    name = name.strip("_").lower()
    stripped = True
    while stripped:  # `reduce_scatter_tensor_coalesced`: both suffixes
        stripped = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, stripped = name[: -len(suffix)].strip("_"), True
                break
    flat = name.replace("_", "")
    return _CANONICAL.get(flat, name)


class DeviceTime(msgspec.Struct, kw_only=True):
    """HTA's temporal breakdown and overlap inputs (microseconds), and communication per step."""

    span_us: float  # first GPU event start to last GPU event end
    busy_us: float
    compute_us: float
    comm_us: float
    overlap_us: float  # communication overlapped by compute
    step_comm_us: list[float] = []  # per step window
    step_overlap_us: list[float] = []


class RankCollectives(msgspec.Struct, kw_only=True):
    """One span's collective instances (parallel arrays) and its per-step phase times and culprits."""

    source: str = ""
    names: list[str] = []
    groups: list[str] = []
    name_id: list[int] = []
    group_id: list[int] = []
    step: list[int] = []  # step number, -1 outside the steps
    ordinal: list[int] = []  # occurrence within (step, group, name)
    seq: list[int] = []  # -1 where unknown
    start_us: list[float] = []
    dur_us: list[float] = []
    compute_overlap_us: list[float] = []
    weight: list[float] = []  # wall time / summed time of its step's instances: concurrent ones share it
    nelems: list[int] = []
    step_numbers: list[int] = []
    step_us: list[float] = []
    phase_us: dict[str, list[float]] = {}  # phase -> per step (communication taken out first)
    culprits_us: dict[str, dict[str, float]] = {}  # phase -> raw event name -> us over the span
    device: Optional[DeviceTime] = None


def extract_collectives(span: SpanInput) -> RankCollectives:
    """One trace file's collective instances, per-step phase times, phase culprits and device times."""
    events = span.events
    source, rows = timed_events(events)
    steps = span.steps
    phases = span.phase_breakdown
    out = RankCollectives(
        step_numbers=[int(n) for n in steps.number],
        step_us=[float(d) for d in steps.duration_us],
        phase_us={c: phases.per_step_us[:, i].tolist() for i, c in enumerate(phases.categories) if c in PHASES},
        # Culprits explain a straggler, found from waits in collectives: none here, none needed.
        culprits_us=_phase_culprits(span) if rows.size else {},
        device=_device_time(events, steps) if span.has_device else None,
    )
    if rows.size == 0:
        return out
    rows = rows[np.argsort(events.ts_us[rows], kind="stable")]
    raw_names = events.comm_name[rows] if source in ("kernel", "record_param_comms") else np.zeros(rows.size, np.int32)
    raw_names = np.where(raw_names > 0, raw_names, events.name[rows])
    names, name_id = _intern([collective_name(s) for s in events.text(raw_names)])
    groups, group_id = _intern(events.text(events.pg_name[rows]))
    start = events.ts_us[rows]
    step = steps.number_at(start)
    out.source, out.names, out.groups = source, names, groups
    out.name_id, out.group_id, out.step = name_id.tolist(), group_id.tolist(), step.tolist()
    out.ordinal = _ordinal(np.stack([step, group_id, name_id])).tolist()
    out.seq = _sequence_numbers(events, source, rows, name_id, names).tolist()
    out.start_us, out.dur_us = start.tolist(), events.dur_us[rows].tolist()
    out.compute_overlap_us = intervals.overlap_per_window(compute_set(span), start, start + events.dur_us[rows]).tolist()
    out.weight = _concurrency_weight(step, start, start + events.dur_us[rows]).tolist()
    out.nelems = np.maximum(events.in_nelems[rows], events.out_nelems[rows]).tolist()
    return out


def _concurrency_weight(step: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per instance, its step's wall time in collectives over the summed durations there (1 when none
    overlap): DDP's buckets run concurrently on gloo's threads or NCCL streams, and per-step totals are
    wall time, so each instance counts for this share of its own duration."""
    weight = np.ones(step.size)
    for number in distinct_values(step).tolist():  # one pass per step (a handful per trace)
        mine = step == number
        total = float((end[mine] - start[mine]).sum())
        if total > 0:
            weight[mine] = intervals.total_length(intervals.union(start[mine], end[mine])) / total
    return weight


def timed_events(events: EventTable) -> tuple[str, np.ndarray]:
    """The events that time collectives on this rank, and which kind they are (see the module doc)."""
    kernels = comm_kernel_mask(events)  # kernels only
    if kernels.any():
        return "kernel", np.flatnonzero(kernels)
    host = events.kind_mask(HOST_RANGES)
    for source, predicate in (("backend", _is_backend_name), ("record_param_comms", _is_record_param_comms), ("c10d", _is_c10d_name)):
        mask = host & events.name_mask(predicate)  # the first kind found wins: the others are not looked for
        if mask.any():
            return source, np.flatnonzero(mask)
    return "", np.zeros(0, dtype=np.int64)


# Named predicates, not lambdas: EventTable.name_mask keeps their masks per table.
def _is_backend_name(name: str) -> bool:
    return name.startswith(BACKEND_PREFIXES)


def _is_record_param_comms(name: str) -> bool:
    return name == "record_param_comms"


def _is_c10d_name(name: str) -> bool:
    return name.startswith("c10d::")


def _is_comm_op_or_record(name: str) -> bool:
    return name.startswith(COMM_OP_PREFIXES) or name == "record_param_comms"


def _is_copy_or_set_name(name: str) -> bool:
    return "Memcpy" in name or "Memset" in name


def _intern(values: list[str]) -> tuple[list[str], np.ndarray]:
    distinct, ids = np.unique(np.array(values, dtype=object), return_inverse=True)
    return [str(v) for v in distinct], ids.astype(np.int64)


def _ordinal(keys: np.ndarray) -> np.ndarray:
    """Occurrence index of each column of `keys` among the columns with the same key (in column order)."""
    n = keys.shape[1]
    order = np.lexsort((np.arange(n), *keys[::-1]))
    sorted_keys = keys[:, order]
    new = np.ones(n, dtype=bool)
    new[1:] = (sorted_keys[:, 1:] != sorted_keys[:, :-1]).any(axis=0)
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    ordinal = np.empty(n, dtype=np.int64)
    ordinal[order] = np.arange(n) - first
    return ordinal


def _sequence_numbers(events: EventTable, source: str, rows: np.ndarray, name_id: np.ndarray, names: list[str]) -> np.ndarray:
    """`Seq` of each instance: its own where it has one, else that of the `record_param_comms` of the same
    collective in the same order, when both lists are equally long (the c10d op and its timed event)."""
    own = events.seq[rows].astype(np.int64)
    if (own >= 0).all() or source == "record_param_comms":
        return own
    records = np.flatnonzero(events.name_mask(_is_record_param_comms) & (events.seq >= 0))
    seq = np.full(rows.size, -1, dtype=np.int64)
    if records.size == 0:
        return seq
    records = records[np.argsort(events.ts_us[records], kind="stable")]
    record_names = np.array([collective_name(s) for s in events.text(events.comm_name[records])], dtype=object)
    for i, name in enumerate(names):  # one pass per distinct collective name (a handful)
        mine = np.flatnonzero(name_id == i)
        theirs = records[record_names == name]
        if theirs.size == mine.size:
            seq[mine] = events.seq[theirs]
    return seq


def compute_set(span: SpanInput) -> intervals.IntervalSet:
    """Compute on this rank: non-communication kernels on GPU traces (HTA's definition), else the host
    operators that are not communication, step markers or torchscope's labels."""
    events = span.events
    if span.has_device:
        rows = events.kind_rows(Kind.KERNEL)
        rows = rows[~comm_kernel_mask(events)[rows]]
    else:
        rows = events.kind_rows(Kind.CPU_OP)
        rows = rows[~(events.name_mask(_is_comm_op_or_record) | step_marker_mask(events) | own_marker_mask(events))[rows]]
    start = events.ts_us[rows]
    return intervals.union(start, start + events.dur_us[rows])


def _device_time(events: EventTable, steps: StepWindows) -> DeviceTime:
    """HTA's temporal breakdown and communication-computation overlap inputs: GPU events (kernels, memcpy,
    memset); communication = NCCL/RCCL kernels, memory = memcpy/memset, compute = the rest. Like HTA,
    the last profiler step is left out (its device work may be cut off by the end of the capture): GPU
    events starting before the last `ProfilerStep` starts on the host."""
    gpu = events.kind_rows(DEVICE_KINDS)  # GPU user annotations are not among them
    markers = np.flatnonzero(step_marker_mask(events))
    if markers.size >= 2:
        gpu = gpu[events.ts_us[gpu] < events.ts_us[markers].max()]
    start = events.ts_us[gpu]
    if not (start[1:] >= start[:-1]).all():  # in start order, `union` need not sort each subset
        gpu = gpu[np.argsort(start, kind="stable")]
    comm = comm_kernel_mask(events)[gpu]
    memory = kind_mask(events.kind[gpu], (Kind.MEMCPY, Kind.MEMSET)) | events.name_mask(_is_copy_or_set_name)[gpu]
    start = events.ts_us[gpu]
    end = start + events.dur_us[gpu]

    def as_set(mask: np.ndarray | None) -> intervals.IntervalSet:
        return intervals.union(start, end) if mask is None else intervals.union(start[mask], end[mask])

    busy, comp, comm_set = as_set(None), as_set(~comm & ~memory), as_set(comm)
    overlap = intervals.intersect(comp, comm_set)
    return DeviceTime(
        span_us=float(busy[1][-1] - busy[0][0]) if busy[0].size else 0.0,
        busy_us=intervals.total_length(busy),
        compute_us=intervals.total_length(comp),
        comm_us=intervals.total_length(comm_set),
        overlap_us=intervals.total_length(overlap),
        step_comm_us=intervals.overlap_per_window(comm_set, steps.start_us, steps.end_us).tolist(),
        step_overlap_us=intervals.overlap_per_window(overlap, steps.start_us, steps.end_us).tolist(),
    )


def _phase_culprits(span: SpanInput) -> dict[str, dict[str, float]]:
    """Per phase, the host events (Python frames, operators, ranges) by their time inside that phase
    (inclusive), largest first: what a rank's extra time in a phase is spent on. Frames that enclose a
    phase range or a step (the training loop, `<module>`) explain every phase, so none of them."""
    events = span.events
    steps = step_marker_mask(events)
    own = steps | own_marker_mask(events)
    enclosing = encloses_markers(events, span.tree) | encloses(span.tree, steps)  # the phases' and own markers' part is shared
    # Whole-table masks combined, then one pass for the rows: cheaper than a gather of each per row.
    noise = own | events.name_mask(is_measurement_frame) | enclosing
    rows = np.flatnonzero(events.kind_mask((Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION)) & ~noise)
    if rows.size == 0 or len(span.steps) == 0:
        return {}
    start = events.ts_us[rows]
    end = start + events.dur_us[rows]
    names, group = group_ids(events.name[rows])
    out: dict[str, dict[str, float]] = {}
    phases = [phase for phase in PHASES if phase in span.phase_sets and span.phase_sets[phase][0].size]
    # One phase's overlaps at a time: each is summed by name, and a (phases x events) array is not needed.
    overlaps = intervals.overlap_rows_of_each([span.phase_sets[phase] for phase in phases], start, end)
    for phase, overlap in zip(phases, overlaps):
        totals = np.bincount(group, overlap, names.size)
        top = np.argsort(-totals)[:CULPRITS_PER_PHASE]
        out[phase] = {events.strings[int(names[i])]: float(totals[i]) for i in top if totals[i] > 0}
    return out
