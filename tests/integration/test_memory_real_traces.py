"""Memory analysis on the real traces that carry `[memory]` events: the ResNet-50 samples (PyTorch 1.9 era:
`Bytes` only, no `Addr`, no totals). Figures are recomputed here from the raw JSON with plain Python."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import torchscope

pytestmark = pytest.mark.slow
from helpers.real_traces import COMMITTED_TRACES, shared_missing_reason, shared_root


def _raw(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _expected_peaks(events: list[dict]) -> dict[str, int]:
    """Per device: the running sum of `Bytes` in time order, shifted so it never goes below zero."""
    by_device: dict[str, list[tuple[float, int]]] = {}
    for e in events:
        if e.get("name") == "[memory]":
            args = e["args"]
            label = "cpu" if args["Device Type"] == 0 else f"cuda:{args['Device Id']}"
            by_device.setdefault(label, []).append((e["ts"], args["Bytes"]))
    peaks = {}
    for label, items in by_device.items():
        total, lowest, highest = 0, 0, 0
        for _, nbytes in sorted(items, key=lambda x: x[0]):
            total += nbytes
            lowest, highest = min(lowest, total), max(highest, total)
        peaks[label] = highest - lowest
    return peaks


def _check(trace: Path) -> None:
    report = torchscope.analyze(trace, jobs=1, use_cache=False)
    memory = report.memory
    events = _raw(trace)
    assert memory.present and not memory.has_addresses
    assert memory.peak_allocated_bytes == _expected_peaks(events)
    for label, peak in memory.peaks.items():
        # Nothing can be paired without addresses: the whole peak is unattributed, no block claimed.
        assert peak.unattributed_bytes == peak.allocated_bytes and peak.alive_by_operator == {}
        assert peak.operator and not peak.operator.startswith("ProfilerStep#")
    assert report.measurements.memory.churn_bytes_per_step == {}
    steps = sorted(int(e["name"].split("#")[1]) for e in events if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    assert {r.step for r in memory.per_step} == set(steps)
    assert not [f for f in report.findings if f.category == "memory" and f.severity != "info"]


def test_committed_resnet50_cut_without_addr() -> None:
    _check(next((COMMITTED_TRACES / "resnet50_num_workers_0").glob("*.json.gz")))


@pytest.mark.skipif(shared_missing_reason() is not None, reason=shared_missing_reason() or "")
def test_full_resnet50_traces_without_addr() -> None:
    for trace in sorted((shared_root() / "gpu" / "resnet50_num_workers_4").glob("*.json.gz"))[:1]:
        _check(trace)
