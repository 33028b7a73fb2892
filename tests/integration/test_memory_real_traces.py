"""Memory analysis on every real trace that carries `[memory]` events: the committed cuts, always, and each
file of ../shared/traces where that folder is present (today the four ResNet-50 files: PyTorch 1.9 era,
`Bytes` only, no `Addr`, no totals). Figures are recomputed here from the raw JSON with plain Python."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

import torchscope
from helpers.real_traces import COMMITTED_TRACES, shared_missing_reason, shared_root, trace_files

pytestmark = pytest.mark.slow
MAX_POINTS = 400  # analysis/memory.py thins each series to this many points


def _text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _memory_traces(root: Path) -> list[Path]:
    """The trace files under `root` that carry `[memory]` events (found by their name in the text)."""
    return [path for path in trace_files(root) if b'"[memory]"' in _text(path)]


COMMITTED = _memory_traces(COMMITTED_TRACES)
SHARED = [] if shared_missing_reason() else _memory_traces(shared_root())


def _label(args: dict[str, Any]) -> str:
    kind = {0: "cpu", 1: "cuda"}.get(args["Device Type"], f"device{args['Device Type']}")
    return kind if args.get("Device Id", -1) < 0 else f"{kind}:{args['Device Id']}"


class _Expected:
    """Per device, from the raw events in time order: the allocated peak (the largest `Total Allocated`;
    without totals, the running sum of `Bytes` shifted so it never goes below zero), the reserved peak
    (the largest nonzero `Total Reserved`), how many events; and whether any event has an `Addr`."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        memory = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
        self.has_addresses = any("Addr" in e["args"] for e in memory)
        self.allocated: dict[str, int] = {}
        self.reserved: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        sums: dict[str, tuple[int, int, int]] = {}  # running total, lowest, highest
        for e in memory:
            args, label = e["args"], _label(e["args"])
            self.counts[label] = self.counts.get(label, 0) + 1
            if "Total Allocated" in args:
                self.allocated[label] = max(self.allocated.get(label, 0), args["Total Allocated"])
            else:
                total, lowest, highest = sums.get(label, (0, 0, 0))
                total += args["Bytes"]
                sums[label] = (total, min(lowest, total), max(highest, total))
            if args.get("Total Reserved", 0) > 0:
                self.reserved[label] = max(self.reserved.get(label, 0), args["Total Reserved"])
        for label, (_, lowest, highest) in sums.items():
            self.allocated[label] = highest - lowest


def _check(trace: Path) -> None:
    report = torchscope.analyze(trace, jobs=1, use_cache=False)
    memory = report.memory
    events = json.loads(_text(trace))["traceEvents"]
    expected = _Expected(events)
    assert memory.present and memory.has_addresses is expected.has_addresses
    assert memory.peak_allocated_bytes == expected.allocated
    assert memory.peak_reserved_bytes == expected.reserved
    for label, count in expected.counts.items():
        series = memory.timeline[label]
        assert len(series) == min(count, MAX_POINTS)
        assert max(value for _, value in series) == expected.allocated[label]  # thinning keeps the peak
        if label in expected.reserved:
            assert max(value for _, value in memory.reserved_timeline[label]) == expected.reserved[label]
    for label, peak in memory.peaks.items():
        assert peak.allocated_bytes == expected.allocated[label]
        assert peak.operator and not peak.operator.startswith("ProfilerStep#")
        if not expected.has_addresses:
            # Nothing can be paired without addresses: the whole peak is unattributed, no block claimed.
            assert peak.unattributed_bytes == peak.allocated_bytes and peak.alive_by_operator == {}
    if not expected.has_addresses:
        assert report.measurements.memory.churn_bytes_per_step == {}  # temporaries need pairs
    steps = {int(e["name"].split("#")[1]) for e in events if e.get("ph") == "X" and str(e.get("name")).startswith("ProfilerStep#")}
    assert {r.step for r in memory.per_step} == steps
    # These are healthy training runs (ResNet-50): no memory finding above info.
    assert not [f for f in report.findings if f.category == "memory" and f.severity != "info"]


def test_the_committed_cuts_with_memory_events_are_both_resnet50_folders() -> None:
    """The committed cuts are checked on every machine: the list must not quietly shrink."""
    assert {path.parent.name for path in COMMITTED} == {"resnet50_num_workers_0", "resnet50_num_workers_4"}


@pytest.mark.parametrize("trace", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_committed_cut(trace: Path) -> None:
    _check(trace)


@pytest.mark.skipif(shared_missing_reason() is not None, reason=shared_missing_reason() or "")
@pytest.mark.parametrize("trace", SHARED or [None], ids=[f"{p.parent.name}/{p.name}" for p in SHARED] or ["absent"])
def test_shared_trace(trace: Path | None) -> None:
    assert trace is not None, "no trace in ../shared/traces carries [memory] events"
    _check(trace)
