"""Memory from `[memory]` instant events (recorded with `profile_memory=True`), per device.

Each event carries the allocation's size (`Bytes`, negative for a free) and, since PyTorch 1.10, the
block's `Addr` and the device's running totals (`Total Allocated`, `Total Reserved`); older traces have
only the sizes, and the allocated total is then their running sum from the start of the capture. Per
device this gives:

* the allocated and reserved totals over time, thinned to at most `MAX_POINTS` points (each bucket keeps
  its maximum, so the peak is never lost);
* the peak: its time, step, phase and operator, and what is alive then, by operator and by the user's
  Python line (blocks paired with their frees by address, `memory_blocks.py`);
* churn per step and growth across steps (`memory_steps.py`).

The per-span summaries merge into the run's as follows: peaks are the maximum over spans and ranks (the
peak's details come from the span that holds it), the timelines are the first span's, step rows are
concatenated, growth is the span's with the most steps; the figures for the rules
(`measurements.memory`) merge as their types declare.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.autograd_markers import autograd_marker_set
from torchscope.analysis.source_lines import source_roots
from torchscope.analysis.memory_blocks import (
    DeviceMemory, MemoryEvents, allocator_events, counts_recorded_events_only, device_memory, enclosing_host_event,
    is_collective_buffer_range, memory_events, owners, pair_blocks, possibly_freed_unseen, under_ranges, user_call_site,
    without_blocks, without_unrecorded_frees,
)
from torchscope.analysis.memory_steps import by_site, growth, line, step_bounds, step_traffic, surviving, surviving_sites
from torchscope.analysis.reduce import merge_sections
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import step_marker_mask
from torchscope.arrays import distinct, group_ids
from torchscope.report.measurements import Memory
from torchscope.report.model import MemoryPeak, MemorySummary
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

MAX_POINTS = 400
DEVICE_TYPE_NAMES = {0: "cpu", 1: "cuda"}
ALLOCATOR_CALLS = frozenset({"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "hipMalloc", "hipFree", "cuMemCreate", "cuMemRelease"})


class MemoryExtract(msgspec.Struct, kw_only=True):
    """One span's memory: the summary shown in reports and the figures the rules read."""

    summary: MemorySummary = msgspec.field(default_factory=MemorySummary)
    figures: Optional[Memory] = None


def device_label(device_type: int, device_id: int) -> str:
    kind = DEVICE_TYPE_NAMES.get(device_type, f"device{device_type}")
    return kind if device_id < 0 else f"{kind}:{device_id}"


class _Attribution(msgspec.Struct, frozen=True):
    """Per memory event: the name code of its operator and of its call site, with the names."""

    op_codes: np.ndarray
    op_names: list[str]
    site_codes: np.ndarray
    site_names: list[str]
    enclosing: np.ndarray


def _attribute(span: SpanInput, memory: MemoryEvents) -> _Attribution:
    """Operator and call site of each allocation (frees get none: nothing reads them). The walks up the
    call tree run once per distinct enclosing event, not once per allocation."""
    events, tree, mem = span.events, span.tree, memory.rows
    alloc = memory.nbytes > 0
    enclosing = np.full(mem.size, -1, dtype=np.int64)
    enclosing[alloc] = enclosing_host_event(events, tree, mem[alloc])
    distinct_enclosing, back = np.unique(enclosing[alloc], return_inverse=True)
    back = back.reshape(-1)
    starts = events.ts_us[np.maximum(distinct_enclosing, 0)]
    found = owners(events, tree, distinct_enclosing, starts)
    distinct_op = found.op
    distinct_sites, site_names = user_call_site(events, found, source_roots(span.file))
    op = np.full(mem.size, -1, dtype=np.int64)
    op[alloc] = distinct_op[back]
    site_codes = np.zeros(mem.size, dtype=np.int64)
    site_codes[alloc] = distinct_sites[back]
    # Without an operator, the record_function range the allocation happens in names it (older traces
    # write `enumerate(DataLoader)#...` as an op); never the step marker.
    inner = np.maximum(enclosing, 0)
    ranged = (enclosing >= 0) & (events.kind[inner] == Kind.CPU_OP) & ~step_marker_mask(events)[inner]
    op_ids, op_codes = group_ids(np.where(op >= 0, events.name[np.maximum(op, 0)], np.where(ranged, events.name[inner], 0)))
    op_names = [events.strings[i] for i in op_ids.tolist()]
    return _Attribution(op_codes.reshape(-1), op_names, site_codes, site_names, enclosing)


def extract_memory(span: SpanInput) -> MemoryExtract:
    events, steps = span.events, span.steps
    figures = _allocator_calls(events, span)
    memory = memory_events(events)
    if memory.rows.size == 0:
        return MemoryExtract(figures=figures if figures.allocator_calls_per_step else None)
    origin = float(steps.start_us[0]) if len(steps) else float(events.ts_us.min(initial=0.0))
    who = _attribute(span, memory)
    summary = MemorySummary(present=True)
    key = memory.device_type.astype(np.int64) * 4096 + (memory.device_id + 1)  # device_id -1 = host
    for k in distinct(key).tolist():
        at = allocator_events(memory, np.flatnonzero(key == k))
        if at.size == 0:
            continue
        label = device_label(int(k // 4096), int(k % 4096) - 1)
        _one_device(span, label, device_memory(memory, at), who, at, origin, summary, figures)
    return MemoryExtract(summary=summary, figures=figures)


def _one_device(
    span: SpanInput, label: str, memory: DeviceMemory, who: _Attribution, at: np.ndarray, origin: float,
    summary: MemorySummary, figures: Memory,
) -> None:  # fmt: skip
    """Fill `summary` and `figures` with one device's timeline, peak, steps and growth (`at`: the
    device's positions in the attribution arrays)."""
    blocks = pair_blocks(memory)
    counts_recorded_only = counts_recorded_events_only(memory)
    memory, unseen_frees = without_unrecorded_frees(memory, blocks)
    sites = who.site_codes[at][blocks.alloc]
    summary.has_addresses = summary.has_addresses or memory.has_addresses()
    summary.unpaired_allocations += int((blocks.free < 0).sum()) if memory.has_addresses() else 0
    summary.unpaired_frees += blocks.orphan_frees
    summary.peak_allocated_bytes[label] = int(memory.allocated.max())
    summary.timeline[label] = _thin(memory.ts_us - origin, memory.allocated)
    summary.timeline_origin_us[label] = origin
    figures.peak_allocated_bytes[label] = float(memory.allocated.max())
    if memory.reserved is not None:
        summary.peak_reserved_bytes[label] = int(memory.reserved.max())
        summary.reserved_timeline[label] = _thin(memory.ts_us - origin, memory.reserved)
        figures.peak_reserved_bytes[label] = float(memory.reserved.max())
    summary.peaks[label] = _peak(span, memory, blocks, who, at, sites, origin)
    steps = span.steps
    if len(steps) == 0:
        return
    traffic = step_traffic(memory, blocks, steps, sites, _in_autograd(span, memory.ts_us), unseen_frees)
    summary.per_step.extend(traffic.rows(label, steps.number))
    n = len(steps)
    if memory.has_addresses():  # temporaries need pairs: an allocated total alone says nothing of them
        figures.churn_bytes_per_step[label] = float(traffic.churn_bytes.mean())
        figures.churn_allocations_per_step[label] = float(traffic.alloc_count.mean())
    for site, size in by_site(traffic.churn_codes, traffic.churn_block_bytes, who.site_names, 1.0 / n, top=5).items():
        figures.churn_sites_bytes_per_step[site] = figures.churn_sites_bytes_per_step.get(site, 0.0) + size
    # c10's CPU allocator reports to the profiler only blocks it saw allocated while recording: its total
    # starts at 0 and frees of older blocks (the previous step's gradients and activations) go unreported,
    # so each trace's first recorded step nets those blocks as growth; the line starts at the second
    # step. (CUDA's caching allocator reports device-wide totals and every free.)
    first = 1 if label.split(":")[0] == DEVICE_TYPE_NAMES[0] else 0
    fit = growth(traffic, first)
    # Never-freed blocks perhaps freed where the profiler does not record it are not a leak's sites; where
    # the total counts only the recorded events they are off the line the leak rule judges, too.
    kept = surviving(memory, blocks, steps)
    doubtful = possibly_freed_unseen(memory, blocks, _under_collectives(span, who, at, blocks))
    fit.surviving_by_call_site = surviving_sites(memory, blocks, kept & ~doubtful, steps, sites, who.site_names)
    fit.unrecorded_frees = int(blocks.unrecorded.sum())
    fit.doubtful_bytes_per_step = float(memory.nbytes[blocks.alloc[kept & doubtful]].sum()) / max(n - 1, 1)
    judged = fit
    if counts_recorded_only and doubtful.any():
        lo, hi = step_bounds(memory, steps)
        before = without_blocks(memory, blocks, doubtful)
        judged = line(np.r_[before[lo][first:], before[hi][-1:]])
    fit.leak_bytes_per_step, fit.leak_low_bytes_per_step, fit.leak_r2 = judged.bytes_per_step, judged.low_bytes_per_step, judged.r2
    summary.growth[label] = fit
    if fit.unrecorded_frees:
        figures.unrecorded_frees_per_step[label] = fit.unrecorded_frees / n
    if fit.doubtful_bytes_per_step:
        figures.doubtful_bytes_per_step[label] = fit.doubtful_bytes_per_step
    if fit.boundaries >= 3:
        figures.growth_bytes_per_step[label] = fit.bytes_per_step
        figures.growth_r2[label] = fit.r2
        figures.growth_steps[label] = float(fit.boundaries - 1)
        figures.leak_growth_bytes_per_step[label] = fit.leak_bytes_per_step
        figures.leak_growth_r2[label] = fit.leak_r2
        for site, size in fit.surviving_by_call_site.items():
            figures.leak_sites_bytes_per_step[site] = figures.leak_sites_bytes_per_step.get(site, 0.0) + size


def _under_collectives(span: SpanInput, who: _Attribution, at: np.ndarray, blocks: Any) -> np.ndarray:
    """Per block: allocated inside a collective's range (memory_blocks.is_collective_buffer_range); only the
    never-freed blocks are looked up (the others need no answer)."""
    found = np.zeros(blocks.alloc.size, dtype=bool)
    never = np.flatnonzero(blocks.free < 0)
    if never.size:
        enclosing = who.enclosing[at][blocks.alloc[never]]
        found[never] = under_ranges(span.events, span.tree, enclosing, is_collective_buffer_range)
    return found


def _peak(
    span: SpanInput, memory: DeviceMemory, blocks: Any, who: _Attribution, at: np.ndarray, sites: np.ndarray, origin: float
) -> MemoryPeak:
    """The allocated peak: when, in which step/phase/operator, and what is alive then."""
    position = int(np.argmax(memory.allocated))
    t = float(memory.ts_us[position])
    alive = blocks.alive_at(position)
    sizes = memory.nbytes[blocks.alloc]
    ops = who.op_codes[at][blocks.alloc]
    step = int(span.steps.index_of(np.array([t]))[0]) if len(span.steps) else -1
    site_code = int(who.site_codes[at][position])
    return MemoryPeak(
        allocated_bytes=int(memory.allocated[position]),
        reserved_bytes=int(memory.reserved[position]) if memory.reserved is not None else None,
        t_us=t - origin,
        origin_us=origin,
        step=int(span.steps.number[step]) if step >= 0 else None,
        phase=_phase_at(span, t),
        operator=who.op_names[int(who.op_codes[at][position])],
        call_site=who.site_names[site_code],
        alive_by_operator=by_site(ops[alive], sizes[alive], [n or "(no op)" for n in who.op_names]),
        alive_by_call_site=by_site(sites[alive], sizes[alive], who.site_names),
        unattributed_bytes=max(int(memory.allocated[position]) - int(sizes[alive].sum()), 0),
    )


def _in_autograd(span: SpanInput, t_us: np.ndarray) -> np.ndarray:
    """Per time, whether a forward or backward marker runs then (see memory_steps: churn). Markers, not
    the phase partition: that counts every unlabelled op as forward."""
    return intervals.contains(autograd_marker_set(span.events), t_us)


def _phase_at(span: SpanInput, t: float) -> str:
    if len(span.steps) == 0:
        return ""
    for name, (starts, ends) in span.phase_sets.items():
        i = int(np.searchsorted(starts, t, side="right")) - 1
        if i >= 0 and t < ends[i]:
            return name
    return ""


def _is_allocator_call(name: str) -> bool:
    """A named predicate, not a lambda: `EventTable.name_mask` keeps its answers per string."""
    return name in ALLOCATOR_CALLS


def _allocator_calls(events: EventTable, span: SpanInput) -> Memory:
    """cudaMalloc/cudaFree (and HIP's) runtime calls per step in the steady state (the steps after a
    span's first): the caching allocator going back to the driver, which a warmed-up loop should not need."""
    runtime = events.kind_mask((Kind.RUNTIME, Kind.DRIVER))
    # The first step of a span may still be warming the cache up: steady state is the steps after it
    # (none without step markers, where the one window includes the set-up).
    if len(span.steps) < 2 or span.steps.source == "whole_trace" or not runtime.any():
        return Memory()
    calls = np.flatnonzero(runtime & events.name_mask(_is_allocator_call))
    calls = calls[span.steps.index_of(events.ts_us[calls]) >= 1]
    n = len(span.steps) - 1
    # The allocator frees inside the operator that needs the memory (an out-of-memory retry); a free under no
    # operator is the cache given back on request: torch.cuda.empty_cache() (not an operator itself).
    frees = calls[events.name_mask(_is_free_call, calls)]
    released = frees[span.times.launching_op[frees] < 0]
    return Memory(
        allocator_calls_per_step=calls.size / n,
        allocator_us_per_step=float(events.dur_us[calls].sum()) / n,
        cache_releases_per_step=released.size / n,
    )


def _is_free_call(name: str) -> bool:
    return name in ("cudaFree", "hipFree", "cuMemRelease")


def _thin(t: np.ndarray, values: np.ndarray) -> list[list[float]]:
    """At most `MAX_POINTS` points: the buckets of np.array_split (the first r hold one more), each kept
    by the first position holding its maximum (the values are integer byte totals: no NaN)."""
    if t.size <= MAX_POINTS:
        return np.column_stack((t, values)).tolist() if t.size else []
    q, r = divmod(t.size, MAX_POINTS)
    # Two blocks of equal-sized buckets as 2-D rows: argmax per row is the first position of its maximum.
    long, short = values[: r * (q + 1)].reshape(r, q + 1), values[r * (q + 1) :].reshape(MAX_POINTS - r, q)
    first = np.concatenate((
        long.argmax(axis=1) + np.arange(r) * (q + 1),
        short.argmax(axis=1) + r * (q + 1) + np.arange(MAX_POINTS - r) * q,
    ))  # fmt: skip
    return np.column_stack((t[first], values[first])).tolist()


def reduce_memory(parts: list[Part[MemoryExtract]]) -> dict[str, Any]:
    out = MemorySummary()
    growth_from: dict[str, int] = {}
    for part in parts:
        memory = part.value.summary
        if not memory.present:
            continue
        out.present = True
        out.has_addresses = out.has_addresses or memory.has_addresses
        out.unpaired_allocations += memory.unpaired_allocations
        out.unpaired_frees += memory.unpaired_frees
        for label, peak in memory.peaks.items():
            if peak.allocated_bytes > out.peak_allocated_bytes.get(label, -1):
                out.peaks[label] = msgspec.structs.replace(peak, rank=part.key.rank)
        for label, peak_bytes in memory.peak_allocated_bytes.items():
            out.peak_allocated_bytes[label] = max(peak_bytes, out.peak_allocated_bytes.get(label, 0))
        for label, peak_bytes in memory.peak_reserved_bytes.items():
            out.peak_reserved_bytes[label] = max(peak_bytes, out.peak_reserved_bytes.get(label, 0))
        for label, series in memory.timeline.items():
            if label not in out.timeline:
                out.timeline[label] = series
                out.timeline_origin_us[label] = memory.timeline_origin_us.get(label, 0.0)
                out.timeline_rank[label] = part.key.rank
        for label, series in memory.reserved_timeline.items():
            out.reserved_timeline.setdefault(label, series)
        out.per_step.extend(msgspec.structs.replace(row, rank=part.key.rank) for row in memory.per_step)
        for label, fit in memory.growth.items():
            if fit.boundaries > growth_from.get(label, -1):
                out.growth[label], growth_from[label] = fit, fit.boundaries
    figures = merge_sections([Part(key=p.key, value=p.value.figures) for p in parts], Memory)
    return {"memory": out, "measurements.memory": figures}


MEMORY = Analysis(
    name="memory", extract=extract_memory, extract_type=MemoryExtract, reduce=reduce_memory, fills=("memory", "measurements.memory")
)
