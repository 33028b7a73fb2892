"""Capture guarantees of issue 14 that the comparison harness (test_capture_corpus.py) cannot see, because
they concern torchscope's own output: where the run directory goes when the script changes directory, that
a second run never lands in an earlier run's folder, that a failed trace export leaves no file, that a
failing rank 0 does not wait for the other ranks, and that torch's and Kineto's log noise is filtered."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torchscope.capture import quiet
from torchscope.capture.rundir import DistEnv, choose_run_dir
from torchscope.capture.tracewriter import TraceWriter

REPO = Path(__file__).resolve().parents[2]


def test_a_run_directory_that_holds_a_run_gets_a_sibling_not_a_nested_run(tmp_path: Path) -> None:
    first = choose_run_dir(tmp_path / "runs", "train", DistEnv())
    assert first == tmp_path / "runs"
    (first / "run.json").write_text("{}")
    second = choose_run_dir(tmp_path / "runs", "train", DistEnv())
    assert second == tmp_path / "runs-2"  # beside it: analysing `runs` never merges the two
    third = choose_run_dir(tmp_path / "runs", "train", DistEnv())
    assert third == tmp_path / "runs-3"
    plain = tmp_path / "many"
    plain.mkdir()
    assert choose_run_dir(plain, "train", DistEnv()).parent == plain  # a folder of runs: a new one inside


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    problems: list[str] = []

    class FullDisk:
        def export_chrome_trace(self, path: str) -> None:
            Path(path).write_text("half")
            Path(path + ".tmp").write_text("half")  # what Kineto leaves when its own write fails
            raise OSError(28, "No space left on device")

    writer = TraceWriter(tmp_path, "host_1", problems.append)
    writer(FullDisk())
    assert list(tmp_path.iterdir()) == [] and writer.files == []
    assert "No space left on device" in problems[0]


def test_a_failing_rank_0_does_not_wait_for_the_other_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscope.cli import endreport, run

    waited: list[int] = []
    monkeypatch.setattr(endreport, "wait_for_manifests", lambda run_dir, world: waited.append(world) or True)
    dist = SimpleNamespace(rank=0, distributed=True, world_size=2, local_world_size=2)
    profiler: Any = SimpleNamespace(run_dir=tmp_path, dist=dist, trace_files=[], run_dir_text=str(tmp_path))
    failed: Any = SimpleNamespace(profiler=profiler, exit_code=1, status="error")
    run.present(failed, report=True, stream=sys.stderr)
    assert waited == []
    done: Any = SimpleNamespace(profiler=profiler, exit_code=0, status="complete")
    run.present(done, report=True, stream=sys.stderr)
    assert waited == [2]


def test_known_noise_lines_are_dropped_and_the_rest_kept() -> None:
    text = (b"USDT:2026-12-01 13:19:57 28590:28590 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
            b"[W1201 13:23:09.597 CPUAllocator.cpp:245] Memory block of unknown size was allocated before\n"
            b"External init callback must run in same thread as registerClient (1 != 2)\n"
            b"the script's own line\n")
    assert quiet.without_noise(text) == b"the script's own line\n"


def test_native_writes_to_fd_2_are_filtered_inside_the_block(capfd: pytest.CaptureFixture[str]) -> None:
    with quiet.native_stderr_filtered():
        os.write(2, b"USDT:2026 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\nkept\n")
    with quiet.native_stderr_filtered(enabled=False):
        os.write(2, b"USDT: x profiler_stop\n")
    assert capfd.readouterr().err == "kept\nUSDT: x profiler_stop\n"


SCRIPT = textwrap.dedent(
    """
    import os, torch
    os.makedirs("elsewhere", exist_ok=True)
    os.chdir("elsewhere")
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = [torch.randn(64) for _ in range(3)]
    for step in range(6):
        if step == 2:
            del kept
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    print("trained")
    """
)


@pytest.mark.slow
def test_the_run_directory_is_resolved_before_the_script_changes_directory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    command = [sys.executable, "-m", "torchscope", "run", "--no-report", "--wait", "0", "--warmup", "1",
               "--active", "2", "train.py"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    manifest = json.loads((tmp_path / "runs" / "run.json").read_text())
    assert manifest["trace_files"] and not (tmp_path / "elsewhere" / "runs").exists()
    # torch's and Kineto's lines about the capture stay off the script's stderr (no -v)
    assert [line for line in result.stderr.splitlines() if not line.startswith("torchscope: ")] == []


FAILING_RANK_0 = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    if dist.get_rank() == 0:
        import sys, time
        print(f"failing at {time.time()}", file=sys.stderr, flush=True)
        raise RuntimeError("rank 0 gives up")
    dist.barrier()  # rank 1 waits for rank 0, which never comes: torchrun must stop it
    """
)


def test_a_failing_rank_0_under_torchrun_exits_promptly_with_its_error(tmp_path: Path) -> None:
    import time

    (tmp_path / "fail0.py").write_text(FAILING_RANK_0)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "torchscope", "run", "--out", "runs", "--wait", "0", "--warmup", "0", "--active", "2", "fail0.py"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    ended = time.time()
    assert done.returncode != 0
    assert "rank 0 gives up" in done.stderr
    failed_at = float(re.search(r"failing at ([0-9.]+)", done.stderr).group(1))  # type: ignore[union-attr]
    # Before the fix rank 0 waited 30 s for rank 1's manifest after failing; torchrun's own shutdown
    # (stopping rank 1, its summary) takes a few seconds. Startup is not counted: it varies with load.
    assert ended - failed_at < 20.0, f"torchrun took {ended - failed_at:.1f} s after rank 0 failed"
    [manifest] = (tmp_path / "runs").glob("**/run.rank0.json")
    data = json.loads(manifest.read_text())
    assert data["status"] == "error" and data["trace_files"]  # what was captured before the error is kept
