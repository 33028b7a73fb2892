"""Capture across ranks: a 2-rank gloo run under `torchrun -m torchscope run` whose rank 1 cannot write its
trace (its disk is full) still trains to the end on both ranks; the manifests record the world size, the
backend, the host names and local ranks, and the report carries them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from torchscope.pipeline.analyze import analyze  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import errno, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:  # this rank's disk is full: every trace export fails
        def full(self, path):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        torch.profiler.profile.export_chrome_trace = full
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for _ in range(8):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        steps += 1
    print(f"rank {dist.get_rank()} trained {steps} steps")
    dist.destroy_process_group()
    """
)


def test_a_rank_that_cannot_write_its_trace_still_trains(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "torchscope", "run", "--no-report", "--out", "runs", "train.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 trained 8 steps" in done.stdout and "rank 1 trained 8 steps" in done.stdout
    assert "could not write a trace file" in done.stderr and "No space left on device" in done.stderr

    runs = tmp_path / "runs"
    manifests = [json.loads((runs / f"run.rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, manifest in enumerate(manifests):
        assert (manifest["rank"], manifest["world_size"], manifest["local_rank"]) == (rank, 2, rank)
        assert manifest["backend"] == "gloo" and manifest["host"] == socket.gethostname()
    assert manifests[1]["trace_files"] == [] and any("No space left" in e for e in manifests[1]["errors"])
    assert len(manifests[0]["trace_files"]) == 1

    report = analyze(runs)  # rank 0's trace alone
    summary = report.run.manifest
    assert (summary["world_size"], summary["backend"]) == (2, "gloo")
    assert summary["hosts"] == [socket.gethostname()] and summary["local_ranks"] == {"0": 0, "1": 1}
    assert report.run.ranks == [0]
