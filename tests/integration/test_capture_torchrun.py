"""A real 2-rank DDP training (gloo, CPU) under `torchrun --standalone -m torchscope run`.

One run directory per launch, one trace and one manifest fragment per rank, the rank in the file names;
a second launch into the same --out gets its own folder; rank 0 alone prints the run directory.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

DDP_SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(8 * 16, 16), torch.randn(8 * 16, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    for x, y in torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print(f"rank {dist.get_rank()} finished")
    dist.destroy_process_group()
    """
)


def torchrun(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "torchscope", "run", *args, "--out", "runs", "ddp.py"]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def check_launch(run_dir: Path) -> None:
    host = re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname()).strip("._")
    for rank in (0, 1):
        manifest = json.loads((run_dir / f"run.rank{rank}.json").read_text())
        assert (manifest["rank"], manifest["world_size"], manifest["local_rank"]) == (rank, 2, rank)
        assert manifest["status"] == "complete" and manifest["options"]["step_marking"] == "optimizer"
        [trace] = manifest["trace_files"]
        assert re.fullmatch(rf"{re.escape(host)}_rank{rank}\.\d{{13}}\.pt\.trace\.json", trace)
        document = json.loads((run_dir / trace).read_text())
        assert document["distributedInfo"]["rank"] == rank
        names = [e.get("name", "") for e in document["traceEvents"]]
        assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [f"ProfilerStep#{i}" for i in (2, 3, 4)]
        assert "gloo:all_reduce" in names and "torchscope:backward" in names
    assert not (run_dir / "run.json").exists()


def test_two_ranks_share_one_run_directory(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)

    first = torchrun(tmp_path)  # with the report: rank 0 waits for rank 1's manifest, then reports
    assert first.returncode == 0, first.stderr
    assert "rank 0 finished" in first.stdout and "rank 1 finished" in first.stdout
    assert first.stderr.count("torchscope: run directory:") == 1
    run_dir = tmp_path / "runs"
    check_launch(run_dir)

    second = torchrun(tmp_path, "--no-report")
    assert second.returncode == 0, second.stderr
    [inner] = [p for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert inner.name.startswith("ddp-")
    check_launch(inner)
    assert len(list(run_dir.glob("*.pt.trace.json"))) == 2  # the first launch's folder is untouched
