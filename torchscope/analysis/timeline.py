"""Timeline lanes (a sidecar): the events the dashboard's Timeline view draws, one lane per host thread,
device stream and host phase, with a level of detail that keeps the page small on huge traces.

Level of detail (docs/html.md says the same for users):
* Each span keeps at most `MAX_EVENTS_PER_SPAN` events, the longest ones (ties broken by time).
* Every event left out is still counted: per lane, in `HIDDEN_BINS` equal time bins over the span, as a
  count and busy time, which the page draws as a density band under the lane. So a stretch full of
  tiny kernels never looks idle.
* The browser merges whatever is narrower than a pixel at the current zoom (drawing time, not here).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
import numpy as np

from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.trace.kinds import DEVICE_KINDS, Kind, kind_mask

MAX_EVENTS_PER_SPAN = 100_000  # about 3.5 MB of the page per span (measured: docs/performance.md)
HIDDEN_BINS = 1_000
MAX_DEPTH = 12  # deeper host nesting is drawn on the last row
_HOST_KINDS = (Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON_FUNCTION, Kind.RUNTIME, Kind.DRIVER, Kind.CUDA_SYNC)
_PHASES = ("data_loading", "forward", "backward", "optimizer", "communication")

LaneKind = Literal["host", "device", "phase"]


class Lane(msgspec.Struct, kw_only=True):
    """One row group of the timeline; `name` and `detail` index `Timeline.strings`."""

    rank: int = 0
    kind: LaneKind
    label: str
    start_us: list[float]  # in time order, relative to `Timeline.origin_us` (absolute within an extract)
    dur_us: list[float]
    name: list[int]
    depth: list[int]
    detail: list[int]
    # Launch-to-kernel flows: the CUDA correlation id of runtime calls and device events, 0 for others
    # (ids repeat across ranks: a flow joins events of the same rank only).
    correlation: list[int] = []
    hidden_start_us: list[float] = []  # bins of the events left out by the level of detail
    hidden_count: list[int] = []
    hidden_us: list[float] = []


class Timeline(msgspec.Struct, kw_only=True):
    """Every lane of a run (or of one span, as an extract), with their shared string table."""

    origin_us: float = 0.0
    strings: list[str]
    lanes: list[Lane]
    events: int = 0  # events in the traces' lanes
    shown: int = 0  # events kept (the rest are in the hidden bins)
    # Per rank: microseconds subtracted from its times to align its clock with the reference rank's (the
    # ends of the same collectives, report.distributed); empty when nothing was shifted.
    clock_shift_us: dict[int, float] = {}
    clock_note: str = ""  # why the ranks were, or were not, shifted (the page shows it)


def extract_timeline(span: SpanInput) -> Timeline:
    """The span's lanes, with at most `MAX_EVENTS_PER_SPAN` events kept."""
    events = span.events
    host = kind_mask(events.kind, _HOST_KINDS)
    device = kind_mask(events.kind, DEVICE_KINDS)
    rows = np.flatnonzero(host | device)
    kept = _longest(events.dur_us[rows], events.ts_us[rows], MAX_EVENTS_PER_SPAN)
    keep = np.zeros(len(events), dtype=bool)
    keep[rows[kept]] = True
    strings = _Strings()
    bounds = _bounds(events.ts_us[rows], events.dur_us[rows])
    lanes = [
        _lane(span, strings, lane_rows, keep, kind, label, bounds)
        for kind, label, lane_rows in _lane_rows(span, rows, device)
    ]
    lanes.extend(_phase_lanes(span, strings))
    return Timeline(strings=strings.table, lanes=lanes, events=int(rows.size), shown=int(kept.size))


def _longest(dur_us: np.ndarray, ts_us: np.ndarray, limit: int) -> np.ndarray:
    """Indices of the `limit` longest events (all when there are fewer), in time order."""
    if dur_us.size <= limit:
        return np.arange(dur_us.size)
    chosen = np.argpartition(-dur_us, limit - 1)[:limit]
    return chosen[np.argsort(ts_us[chosen], kind="stable")]


def _bounds(ts_us: np.ndarray, dur_us: np.ndarray) -> tuple[float, float]:
    if ts_us.size == 0:
        return 0.0, 1.0
    start, end = float(ts_us.min()), float((ts_us + np.maximum(dur_us, 0)).max())
    return start, max(end, start + 1.0)


def _lane_rows(span: SpanInput, rows: np.ndarray, device: np.ndarray) -> list[tuple[LaneKind, str, np.ndarray]]:
    """(kind, label, event rows) per host thread and per device stream, host first."""
    events = span.events
    out: list[tuple[LaneKind, str, np.ndarray]] = []
    host_rows = rows[~device[rows]]
    keys = events.pid[host_rows].astype(np.int64) << 32 | events.tid[host_rows].astype(np.int64)
    for key in np.unique(keys):
        lane = host_rows[keys == key]
        out.append(("host", f"{events.text(int(key >> 32))} / thread {events.text(int(key & 0xFFFFFFFF))}", lane))
    dev_rows = rows[device[rows]]
    keys = events.device[dev_rows].astype(np.int64) << 32 | events.stream[dev_rows].astype(np.int64)
    for key in np.unique(keys):
        lane = dev_rows[keys == key]
        out.append(("device", f"device {int(key >> 32)} / stream {int(key & 0xFFFFFFFF)}", lane))
    return out


def _lane(
    span: SpanInput, strings: "_Strings", rows: np.ndarray, keep: np.ndarray, kind: LaneKind, label: str,
    bounds: tuple[float, float],
) -> Lane:
    events = span.events
    shown, hidden = rows[keep[rows]], rows[~keep[rows]]
    shown = shown[np.argsort(events.ts_us[shown], kind="stable")]  # time order: the page binary-searches a zoom
    depth = np.clip(span.tree.depth[shown], 0, MAX_DEPTH) if kind == "host" else np.zeros(shown.size, np.int64)
    lane = Lane(
        kind=kind,
        label=label,
        start_us=events.ts_us[shown].tolist(),
        dur_us=np.maximum(events.dur_us[shown], 0.0).round(3).tolist(),
        name=strings.ids(events, events.name[shown]),
        depth=depth.tolist(),
        detail=strings.details(events, shown),
        correlation=_correlations(events, shown),
    )
    if hidden.size:
        _fill_hidden(lane, events.ts_us[hidden], events.dur_us[hidden], bounds)
    return lane


def _correlations(events: Any, rows: np.ndarray) -> list[int]:
    linked = kind_mask(events.kind[rows], (Kind.RUNTIME, *DEVICE_KINDS))
    return np.where(linked, np.maximum(events.correlation[rows], 0), 0).tolist()


def _fill_hidden(lane: Lane, ts_us: np.ndarray, dur_us: np.ndarray, bounds: tuple[float, float]) -> None:
    """Count and busy time of the left-out events per time bin (only the bins that have some)."""
    width = (bounds[1] - bounds[0]) / HIDDEN_BINS
    index = np.clip(((ts_us - bounds[0]) / width).astype(np.int64), 0, HIDDEN_BINS - 1)
    counts = np.bincount(index, minlength=HIDDEN_BINS)
    busy = np.bincount(index, weights=np.maximum(dur_us, 0.0), minlength=HIDDEN_BINS)
    used = np.flatnonzero(counts)
    lane.hidden_start_us = (bounds[0] + used * width).tolist()
    lane.hidden_count = counts[used].tolist()
    lane.hidden_us = busy[used].round(3).tolist()


def _phase_lanes(span: SpanInput, strings: "_Strings") -> list[Lane]:
    """One lane of the host phases (forward, backward, ...), at most `MAX_EVENTS_PER_SPAN` ranges."""
    starts, ends, names = [], [], []
    for phase in _PHASES:
        begin, end = span.phase_sets.get(phase, (np.zeros(0), np.zeros(0)))
        starts.append(np.asarray(begin, dtype=np.float64))
        ends.append(np.asarray(end, dtype=np.float64))
        names.append(np.full(len(begin), strings.id(phase), dtype=np.int64))
    start, end, name = np.concatenate(starts), np.concatenate(ends), np.concatenate(names)
    if start.size == 0:
        return []
    chosen = _longest(end - start, start, MAX_EVENTS_PER_SPAN)
    zeros = [0] * chosen.size
    return [Lane(kind="phase", label="phases", start_us=start[chosen].tolist(),
                 dur_us=(end - start)[chosen].round(3).tolist(), name=name[chosen].tolist(), depth=zeros,
                 detail=zeros, correlation=zeros)]


class _Strings:
    """A string table of its own (the trace's also holds stacks and shapes of events never shown)."""

    def __init__(self) -> None:
        self.table: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def id(self, text: str) -> int:
        found = self._index.get(text)
        if found is None:
            found = self._index[text] = len(self.table)
            self.table.append(text)
        return found

    def ids(self, events: Any, trace_ids: np.ndarray) -> list[int]:
        return [self.id(text) for text in events.text(trace_ids)]

    def details(self, events: Any, rows: np.ndarray) -> list[int]:
        """What a click shows besides name and times: the args the trace tables keep (`_DETAIL_TEXT`,
        `_DETAIL_NUMBERS`), one `title: value` line each where the event has it. Per-event ids (External
        id, Seq, Addr) are left out: each would make every event's text unique and the page large."""
        if not rows.size:
            return []
        parts = []
        for column, title in _DETAIL_TEXT:
            ids = getattr(events, column)[rows]
            parts.append([f"{title}: {t}" if t else "" for t in events.text(ids)])
        for column, title in _DETAIL_NUMBERS:
            values = np.asarray(getattr(events, column)[rows])
            has = ~np.isnan(values) if values.dtype.kind == "f" else values >= 0
            if has.any():
                line = np.full(rows.size, "", dtype=object)
                line[has] = [f"{title}: {v:.4g}" if isinstance(v, float) else f"{title}: {v}" for v in values[has].tolist()]
                parts.append(line.tolist())
        return [self.id("\n".join(p for p in row if p)) for row in zip(*parts)]


# (column, title) of the args a click on an event shows, in this order; absent values are skipped.
_DETAIL_TEXT = (
    ("input_dims", "shapes"), ("input_type", "types"), ("concrete_inputs", "concrete inputs"), ("call_stack", "stack"),
    ("grid", "grid"), ("block", "block"), ("comm_name", "collective"), ("pg_name", "process group"), ("comm_dtype", "dtype"),
)
_DETAIL_NUMBERS = (
    ("nbytes", "bytes"), ("bandwidth_gbps", "memory bandwidth (GB/s)"), ("registers_per_thread", "registers per thread"),
    ("blocks_per_sm", "blocks per SM"), ("occupancy_pct", "est. achieved occupancy %"), ("group_size", "group size"),
    ("in_nelems", "in msg nelems"), ("out_nelems", "out msg nelems"),
)


def reduce_timeline(parts: list[Part[Timeline]]) -> dict[str, Any]:
    """Every span's lanes under one string table, times relative to the earliest event of the run."""
    starts = [min(lane.start_us) for p in parts for lane in p.value.lanes if lane.start_us]
    origin = min(starts) if starts else 0.0
    strings = _Strings()
    lanes = []
    for part in parts:
        remap = np.array([strings.id(s) for s in part.value.strings], dtype=np.int64)
        for lane in part.value.lanes:
            lanes.append(_rebased(lane, part.key.rank, origin, remap))
    timeline = Timeline(
        origin_us=origin, strings=strings.table, lanes=lanes,
        events=sum(p.value.events for p in parts), shown=sum(p.value.shown for p in parts),
    )
    return {"timeline": timeline}


def _rebased(lane: Lane, rank: int, origin: float, remap: np.ndarray) -> Lane:
    def relative(values: list[float]) -> list[float]:
        return (np.asarray(values, dtype=np.float64) - origin).round(3).tolist()

    return msgspec.structs.replace(
        lane, rank=rank, start_us=relative(lane.start_us), hidden_start_us=relative(lane.hidden_start_us),
        name=remap[np.asarray(lane.name, dtype=np.int64)].tolist() if lane.name else [],
        detail=remap[np.asarray(lane.detail, dtype=np.int64)].tolist() if lane.detail else [],
    )


def align_ranks(timeline: Timeline, offsets: dict[int, float], hosts: list[str] | None = None) -> Timeline:
    """The timeline with each rank's times minus its clock offset (`RankDistributed.clock_offset_us`: its
    end of a collective minus the reference rank's end of the same one), so the same collective ends at
    the same place on every rank; the origin moves to the earliest aligned event.

    Ranks that all ran on one host (`hosts`, from the manifests) read one clock: their offsets are only the
    collectives' own jitter (gloo's threads leave a collective when they are scheduled), so nothing is
    shifted then and `clock_note` says why."""
    ranks = sorted({lane.rank for lane in timeline.lanes})
    shifts = {r: float(offsets.get(r, 0.0)) for r in ranks}
    if len(ranks) < 2 or not any(shifts.values()):
        return timeline
    largest = max(abs(v) for v in shifts.values())
    if hosts is not None and len(hosts) == 1:
        note = (f"Ranks not shifted: all ran on host {hosts[0]} and read one clock (their collectives' ends "
                f"differ by up to {largest:.0f} us, which is the collectives' jitter, not a clock offset).")
        return msgspec.structs.replace(timeline, clock_note=note)
    lanes = [
        msgspec.structs.replace(
            lane,
            start_us=_shifted(lane.start_us, shifts[lane.rank]),
            hidden_start_us=_shifted(lane.hidden_start_us, shifts[lane.rank]),
        )
        for lane in timeline.lanes
    ]
    starts = [min(lane.start_us) for lane in lanes if lane.start_us]
    rebase = min(min(starts), 0.0) if starts else 0.0  # keep every time >= 0
    if rebase:
        lanes = [msgspec.structs.replace(lane, start_us=_shifted(lane.start_us, rebase),
                                         hidden_start_us=_shifted(lane.hidden_start_us, rebase)) for lane in lanes]
    moved = ", ".join(f"rank {r} shifted by {-v:+.0f} us" for r, v in shifts.items() if v)
    note = f"Clocks aligned: {moved} to align the ends of the same collectives (times on the reference rank's clock)."
    return msgspec.structs.replace(timeline, lanes=lanes, origin_us=timeline.origin_us + rebase,
                                   clock_shift_us={r: round(v, 3) for r, v in shifts.items()}, clock_note=note)


def _shifted(values: list[float], by: float) -> list[float]:
    return (np.asarray(values, dtype=np.float64) - by).round(3).tolist() if by and values else values


TIMELINE = Analysis(
    name="timeline", extract=extract_timeline, extract_type=Timeline, reduce=reduce_timeline, sidecar=True
)
