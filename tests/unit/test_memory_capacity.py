"""memory.near_capacity compares each GPU's peak with that GPU's own capacity (deviceProperties by id), on
synthetic traces of processes that see GPUs of different sizes; the CPU is never compared with a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.trace_builder import TraceBuilder

from torchscope.pipeline.analyze import analyze
from torchscope.report.model import Report

GiB = 2**30


def _trace(tmp_path: Path, capacities: dict[int, int], peaks: dict[tuple[int, int], int], name: str = "trace") -> Report:
    """Busy GPU steps; `peaks`: (device type, device id) -> allocated bytes reached in step 1."""
    b = TraceBuilder().gpu(memory=capacities[0])
    b.header["deviceProperties"] = [dict(b.header["deviceProperties"][0], id=i, totalGlobalMem=c) for i, c in capacities.items()]
    for i in range(4):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000.0)
        b.launch(t0 + 20, 10, t0 + 100, 9_000.0)
    for n, ((device_type, device_id), peak) in enumerate(peaks.items()):
        b.memory(10_100.0 + n, allocated=peak, reserved=peak, device_type=device_type, device_id=device_id, delta=peak)
    return analyze(b.write(tmp_path / f"{name}.pt.trace.json"), jobs=1, use_cache=False)


def _near(report: Report) -> list[dict]:
    return [f.evidence for f in report.findings if f.id == "memory.near_capacity"]


def test_each_gpu_against_its_own_capacity(tmp_path: Path) -> None:
    # cuda:1 (16 GiB) at 15 GiB is full although it is under 20 % of cuda:0's 80 GiB; cuda:0 at 70 GiB is not.
    report = _trace(tmp_path, {0: 80 * GiB, 1: 16 * GiB}, {(1, 0): 70 * GiB, (1, 1): 15 * GiB})
    assert report.device.memory_bytes_by_id == {0: 80 * GiB, 1: 16 * GiB}
    [evidence] = _near(report)
    assert evidence["device"] == "cuda:1" and evidence["total_memory_bytes"] == 16 * GiB
    assert evidence["ratio"] == pytest.approx(15 / 16, abs=1e-3)


def test_a_large_gpu_is_not_judged_by_a_small_one(tmp_path: Path) -> None:
    # The first device listed is the small one: 70 GiB on the 80 GiB cuda:1 is 87.5 %, under the threshold.
    assert _near(_trace(tmp_path, {0: 16 * GiB, 1: 80 * GiB}, {(1, 0): 1 * GiB, (1, 1): 70 * GiB})) == []


def test_the_cpu_is_never_compared_with_a_gpu(tmp_path: Path) -> None:
    # 79 GiB of host memory against an 80 GiB GPU: no finding; the GPU itself is nearly empty.
    assert _near(_trace(tmp_path, {0: 80 * GiB}, {(0, -1): 79 * GiB, (1, 0): 1 * GiB})) == []
