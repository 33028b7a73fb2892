"""A real 2-rank DDP training with the NCCL backend on 2 GPUs under `torchrun --standalone -m torchscope run`.

Runs only where CUDA, NCCL and at least 2 GPUs exist (skipped elsewhere, saying which is missing). The
capture knows no backend by name (it asks `torch.distributed.get_backend()` while tracing; the CPU check of
that is tests/integration/test_capture_backend.py); this checks the real thing end to end: each rank's
manifest (backend "nccl", world size, local rank), NCCL kernels in each rank's trace, and a report whose
distributed section is present with both ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def missing() -> str | None:
    """What this machine lacks for an NCCL launch, or None."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return "torch.distributed has no NCCL backend"
    if torch.cuda.device_count() < 2:
        return f"2 GPUs are needed for 2 NCCL ranks, this machine has {torch.cuda.device_count()}"
    return None


if missing() is not None:
    pytest.skip(f"NCCL capture under torchrun: {missing()}", allow_module_level=True)

from torchscope.pipeline.analyze import analyze  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
    model = DistributedDataParallel(net, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(10 * 32, 256), torch.randn(10 * 32, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    for x, y in torch.utils.data.DataLoader(data, batch_size=32, sampler=sampler):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()} finished")
    dist.destroy_process_group()
    """
)


def test_two_nccl_ranks_are_captured_and_analysed(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "torchscope", "run", "--no-report", "--out", "runs", "ddp.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "rank 0 finished" in done.stdout and "rank 1 finished" in done.stdout

    run_dir = tmp_path / "runs"
    for rank in (0, 1):
        manifest = json.loads((run_dir / f"run.rank{rank}.json").read_text())
        assert manifest["status"] == "complete", manifest["errors"]
        assert (manifest["rank"], manifest["world_size"], manifest["local_rank"]) == (rank, 2, rank)
        assert manifest["backend"] == "nccl"
        assert "cuda" in [a.lower() for a in manifest["activities"]]
        [trace] = manifest["trace_files"]
        events = json.loads((run_dir / trace).read_text())["traceEvents"]
        kernels = [e.get("name", "") for e in events if e.get("cat") == "kernel"]
        assert any(name.startswith("nccl") for name in kernels), sorted(set(kernels))[:20]

    report = analyze(run_dir, use_cache=False)
    assert report.distributed.present
    assert sorted(r.rank for r in report.distributed.ranks) == [0, 1]
