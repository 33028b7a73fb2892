"""Real multi-rank gloo training on the CPU under `torchrun -m torchscope run`, one rank slowed on purpose.

The slow rank must be named with the phase that makes it late and the function that does it; the time the
other ranks wait for it must not be charged to communication; a balanced run has no straggler warning.
The balanced run also has a rank that cannot write its trace (capture across ranks: it still trains, the
manifests record world size, backend, hosts and local ranks), so that one launch serves both.
"""

from __future__ import annotations

import json
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from helpers.torchrun_capture import torchrun_capture  # noqa: E402
from torchscope.pipeline.analyze import analyze  # noqa: E402
from torchscope.report.model import Finding, Report  # noqa: E402

pytestmark = pytest.mark.slow

# Every rank sleeps 500 ms per step in its forward: a step as long as a real one, so that what a loaded
# 2-core machine adds (one rank descheduled for tens of ms, an all-reduce of milliseconds when 4 ranks share
# 2 cores) stays small against it, as it would against real steps; the slow rank sleeps 150 ms more in its
# data loading or its forward. Sleeping costs no CPU, so the test stays light.
SCRIPT = textwrap.dedent(
    """
    import errno, os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    SLOW_RANK, WHERE, SLOW_S = int(os.environ["SLOW_RANK"]), os.environ["SLOW_WHERE"], 0.150
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == int(os.environ.get("NO_TRACE_RANK", "-1")):  # this rank's disk is full: every trace export fails
        def full(self, path):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        torch.profiler.profile.export_chrome_trace = full

    def decode_sample(i):
        if rank == SLOW_RANK and WHERE == "data":
            time.sleep(SLOW_S / 8)
        return torch.full((16,), float(i)), torch.ones(1)

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return 8 * 8 * dist.get_world_size()
        def __getitem__(self, i):
            return decode_sample(i)

    def augment(x):
        time.sleep(0.500)
        if rank == SLOW_RANK and WHERE == "forward":
            time.sleep(SLOW_S)
        return x

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        def forward(self, x):
            return self.body(augment(x))

    torch.manual_seed(0)
    model = DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples()
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    steps = 0
    for x, y in torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        steps += 1
    print(f"rank {rank} trained {steps} steps")
    dist.destroy_process_group()
    """
)


def launch(tmp_path: Path, ranks: int, slow_rank: int, where: str) -> Report:
    run(tmp_path, ranks, slow_rank, where)
    return analyze(tmp_path / "runs")


def run(tmp_path: Path, ranks: int, slow_rank: int, where: str, no_trace_rank: int = -1) -> subprocess.CompletedProcess[str]:
    env = {"SLOW_RANK": str(slow_rank), "SLOW_WHERE": where, "NO_TRACE_RANK": str(no_trace_rank)}
    return torchrun_capture(tmp_path, SCRIPT, ranks, env)


def finding(report: Report, rule: str) -> Finding | None:
    return next((f for f in report.findings if f.id == rule), None)


def check_straggler(report: Report, rank: int, phase: str, culprit: str) -> None:
    straggler = finding(report, "straggler.rank")
    assert straggler is not None and straggler.severity in ("warning", "critical"), report.findings
    evidence = straggler.evidence
    assert evidence["straggler_rank"] == rank
    assert evidence["late_phase"] == phase, evidence
    assert any(culprit in name for name in evidence["culprits_us_per_step"]), evidence["culprits_us_per_step"]
    # The planted 150 ms: the others wait for most of it in each step (some of it hides in their own work).
    assert all(75_000 < us < 300_000 for us in evidence["lateness_us_by_step"].values()), evidence
    communication = finding(report, "communication.share")
    assert communication is None or communication.severity == "info", communication
    assert report.distributed.match_method == "order" and report.distributed.matched > 0


def test_two_ranks_one_slow_in_data_loading(tmp_path: Path) -> None:
    report = launch(tmp_path, ranks=2, slow_rank=1, where="data")
    check_straggler(report, rank=1, phase="data_loading", culprit="decode_sample")


def test_four_ranks_one_slow_in_forward(tmp_path: Path) -> None:
    report = launch(tmp_path, ranks=4, slow_rank=2, where="forward")
    check_straggler(report, rank=2, phase="forward", culprit="augment")
    assert len(report.distributed.ranks) == 4


def test_balanced_run_has_no_straggler_warning_and_a_rank_that_cannot_write_still_trains(tmp_path: Path) -> None:
    """One launch for two things (each torchrun launch costs 25-45 s of CI): 3 balanced ranks, of which
    rank 2 cannot write its trace (its disk is full). All 3 train to the end; the manifests record the world
    size, backend, hosts and local ranks; the 2 ranks analysed have no straggler warning."""
    done = run(tmp_path, ranks=3, slow_rank=-1, where="none", no_trace_rank=2)
    assert all(f"rank {rank} trained 8 steps" in done.stdout for rank in range(3)), done.stdout
    assert "could not write a trace file" in done.stderr and "No space left on device" in done.stderr
    runs = tmp_path / "runs"
    manifests = [json.loads((runs / f"run.rank{rank}.json").read_text()) for rank in range(3)]
    for rank, manifest in enumerate(manifests):
        assert (manifest["rank"], manifest["world_size"], manifest["local_rank"]) == (rank, 3, rank)
        assert manifest["backend"] == "gloo" and manifest["host"] == socket.gethostname()
    assert manifests[2]["trace_files"] == [] and any("No space left" in e for e in manifests[2]["errors"])
    assert all(len(m["trace_files"]) == 1 for m in manifests[:2])

    report = analyze(runs)  # ranks 0 and 1
    summary = report.run.manifest
    assert (summary["world_size"], summary["backend"]) == (3, "gloo")
    assert summary["hosts"] == [socket.gethostname()] and summary["local_ranks"] == {"0": 0, "1": 1, "2": 2}
    assert report.run.ranks == [0, 1]
    straggler = finding(report, "straggler.rank")
    assert straggler is None or straggler.severity == "info", straggler
    assert report.distributed.present and report.distributed.world_size == 2
