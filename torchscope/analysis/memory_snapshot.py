"""A CUDA memory snapshot summarised: per device, the caching allocator now (reserved, allocated, free
and how fragmented the free memory is, the call sites holding memory) and over the recorded history
(the peak and the sites alive then, cudaMalloc/cudaFree calls, OOMs).

Format (torch/cuda/memory.py `_snapshot`): `segments` (one per cudaMalloc: `device`, `total_size`,
`allocated_size`, `blocks` with `size`, `requested_size`, `state`, `frames`) and `device_traces` (per
device, allocator actions in order: `alloc`, `free_requested`, `free_completed`, `segment_alloc`,
`segment_free`, `oom`, `snapshot`, with `addr`, `size`, `frames`). Values of the wrong type are skipped
(the input is untrusted), never trusted.

The history is a window (`max_entries`), so the allocated total at its start is unknown from the
history alone: it is the allocated total now less the history's net allocations.
"""

from __future__ import annotations

from typing import Any

from torchscope.analysis.frames import is_library_code, readable
from torchscope.report.snapshot import SnapshotDevice, SnapshotSite, SnapshotSummary

TOP_SITES = 10


def summarize_snapshot(snapshot: dict[str, Any], path: str) -> SnapshotSummary:
    """The summary of a snapshot dict (as `trace.snapshot.load_snapshot` returns it)."""
    devices: dict[int, SnapshotDevice] = {}
    sites: dict[int, dict[str, list[int]]] = {}
    for segment in _dicts(snapshot.get("segments")):
        device = _int(segment, "device")
        _add_segment(devices.setdefault(device, SnapshotDevice(device=device)), sites.setdefault(device, {}), segment)
    for device, summary in devices.items():
        summary.top_sites = _top(sites.get(device, {}))
        free = summary.inactive_bytes
        summary.fragmentation = 1.0 - summary.largest_inactive_bytes / free if free > 0 else 0.0
    traces = snapshot.get("device_traces")
    for device, entries in enumerate(traces if isinstance(traces, list) else []):
        entries = list(_dicts(entries))
        if entries:
            _replay(devices.setdefault(device, SnapshotDevice(device=device)), entries)
    return SnapshotSummary(path=path, devices=[devices[d] for d in sorted(devices)])


def _add_segment(summary: SnapshotDevice, sites: dict[str, list[int]], segment: dict[str, Any]) -> None:
    summary.segments += 1
    summary.reserved_bytes += _int(segment, "total_size")
    summary.expandable_segments = summary.expandable_segments or segment.get("is_expandable") is True
    for block in _dicts(segment.get("blocks")):
        size = _int(block, "size")
        state = block.get("state")
        if state == "inactive":
            summary.inactive_bytes += size
            summary.largest_inactive_bytes = max(summary.largest_inactive_bytes, size)
        elif state in ("active_allocated", "active_pending_free", "active_awaiting_free"):
            summary.allocated_bytes += size
            summary.requested_bytes += _int(block, "requested_size") or size
            held = sites.setdefault(user_site(block.get("frames")), [0, 0])
            held[0] += size
            held[1] += 1


def _replay(summary: SnapshotDevice, entries: list[dict[str, Any]]) -> None:
    """Peak allocated over the history, and the sites alive at it (a replay in order; snapshots hold
    at most `max_entries` actions, so a loop over them is bounded)."""
    frees = "free_completed" if any(e.get("action") == "free_completed" for e in entries) else "free_requested"
    live: dict[int, tuple[int, str]] = {}
    net = peak = 0
    peak_live: dict[int, tuple[int, str]] = {}
    for entry in entries:
        action, size = entry.get("action"), _int(entry, "size")
        if action == "alloc":
            live[_int(entry, "addr")] = (size, user_site(entry.get("frames")))
            net += size
            if net > peak:
                peak, peak_live = net, dict(live)
        elif action == frees:
            live.pop(_int(entry, "addr"), None)
            net -= size
        elif action == "segment_alloc":
            summary.segment_allocs += 1
        elif action == "segment_free":
            summary.segment_frees += 1
        elif action == "oom":
            summary.ooms += 1
    start = summary.allocated_bytes - net  # allocated before the history began
    summary.history_entries = len(entries)
    summary.peak_allocated_bytes = max(start + peak, start, 0)
    held: dict[str, list[int]] = {}
    for size, site in peak_live.values():
        counts = held.setdefault(site, [0, 0])
        counts[0] += size
        counts[1] += 1
    summary.peak_sites = _top(held)
    summary.peak_unattributed_bytes = max(summary.peak_allocated_bytes - sum(s for s, _ in peak_live.values()), 0)


def user_site(frames: Any) -> str:
    """The innermost frame of user code (not torch, not the standard library, not C++ `??`) as
    `name (file.py:line)`; "(unknown)" without one (history recorded without stacks)."""
    for frame in _dicts(frames):
        filename, name, line = frame.get("filename"), frame.get("name"), frame.get("line")
        if isinstance(filename, str) and filename.endswith(".py") and not is_library_code(filename):
            return readable(f"{filename}({line if isinstance(line, int) else 0}): {name if isinstance(name, str) else '?'}")
    return "(unknown)"


def _top(sites: dict[str, list[int]]) -> list[SnapshotSite]:
    ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP_SITES]
    return [SnapshotSite(site=site, bytes=size, blocks=count) for site, (size, count) in ranked]


def _dicts(values: Any) -> list[dict[str, Any]]:
    return [v for v in values if isinstance(v, dict)] if isinstance(values, (list, tuple)) else []


def _int(values: dict[str, Any], key: str) -> int:
    value = values.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
