"""The CPU's matmul and copy rates measured at the end of a CPU capture (capture/cpu_peak.py): recorded in
the manifest, outside the trace, and what the compute verdict compares the run's matmuls with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torchscope

torch = pytest.importorskip("torch")


def test_a_completed_cpu_capture_records_the_cpus_peak_outside_the_trace(tmp_path: Path) -> None:
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with torchscope.profile(out=tmp_path / "run") as prof:
        for _ in range(6):
            torch.mm(a, b)
            prof.step()
    [manifest_path] = (tmp_path / "run").glob("run*.json")
    environment = json.loads(manifest_path.read_text())["environment"]
    peak = environment["cpu_peak"]
    # A 2-core VM does a few to hundreds of GFLOP/s and GB/s; zero or absurd figures mean a broken timer.
    assert 0.5 < peak["matmul_gflops"] < 1e5 and 0.1 < peak["copy_gbps"] < 1e4
    assert peak["threads"] == torch.get_num_threads()
    [trace] = (tmp_path / "run").glob("*.pt.trace.json")
    shapes = [e.get("args", {}).get("Input Dims") for e in json.loads(trace.read_text())["traceEvents"]]
    assert [[512, 512], [512, 512]] not in [s[:2] if isinstance(s, list) else None for s in shapes]  # not profiled
    report = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False)
    assert report.run.manifest["environment"]["cpu_peak"]["matmul_gflops"] == peak["matmul_gflops"]
