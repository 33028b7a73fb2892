"""A real FSDP2 training (two gloo ranks, CPU) under `torchrun -m torchscope run`: some of FSDP's
collective buffers are freed on threads the profiler does not follow, so the recorded CPU total rises each
step while the process's memory does not (tests/data/captures/fsdp2_gloo_cpu/README.md). The report must
not call that a leak, and says why it gives no verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchscope

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = (REPO / "tests" / "data" / "captures" / "fsdp2_gloo_cpu" / "README.md").read_text().split("```python\n")[1].split("```")[0]


def test_fsdp2_buffers_freed_on_gloo_threads_are_no_leak(tmp_path: Path) -> None:
    (tmp_path / "fsdp.py").write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "torchscope",
               "run", "--active", "8", "--no-stack", "--no-shapes", "--no-report", "--out", "runs", "fsdp.py"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = torchscope.analyze(tmp_path / "runs", jobs=1, use_cache=False)
    assert report.run.ranks == [0, 1] and len(report.steps) == 16
    ids = [f.id for f in report.findings]
    assert "memory.leak" not in ids
    # The recorded total rises by the collectives' buffers the trace never saw freed: said, with no verdict
    # (unless the recorded line itself is too flat or crooked for the leak thresholds this time).
    memory = report.measurements.memory
    assert memory.doubtful_bytes_per_step["cpu"] > 0
    rising = memory.growth_bytes_per_step["cpu"] >= 1024 * 1024 and memory.growth_r2["cpu"] >= 0.9
    assert "trace_quality.unrecorded_frees" in ids or not rising
