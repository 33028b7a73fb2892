"""Fault injection in capture (issue 5): the training script's own output and exit code never change.

Faults are injected from a wrapper that patches torch (or the file system) *before* calling the real
CLI in the same process -- no test-only switch in torchscope itself:

* the profiler fails to start, the trace handler raises (disk full), the output folder is read-only:
  the script runs to its end, same stdout, same exit code, and torchscope says why in ONE stderr line;
* SIGINT / SIGTERM during the active window: the partial trace is loadable JSON and the manifest says
  "interrupted"; the process ends as Python would (KeyboardInterrupt / killed by SIGTERM).

An exception inside the script is covered in test_capture_run.py (trace + manifest "error", exit 1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.signals import default_signals

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

TRAIN = textwrap.dedent(
    """
    import sys, torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(8):
        opt.zero_grad()
        loss = model(torch.ones(4, 8) * i).pow(2).mean()
        loss.backward()
        opt.step()
        print(f"step {i} loss {loss.item():.6f}")
    print("the script's stderr", file=sys.stderr)
    sys.exit(5)
    """
)

# Long enough to be interrupted: tells the test (on stdout) when the active window is running.
SLOW = textwrap.dedent(
    """
    import time, torch
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(100000):
        opt.zero_grad()
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        if i == 5:
            print("in the active window", flush=True)
        time.sleep(0.02)
    """
)

WRAPPER = textwrap.dedent(
    """
    import os, sys
    import torch, torch.profiler

    fault, target, cli_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    if fault == "start":
        def start(self):
            raise RuntimeError("injected: the profiler cannot start")
        torch.profiler.profile.start = start
    elif fault == "handler":
        def export_chrome_trace(self, path, *args, **kwargs):
            raise OSError(28, "No space left on device")
        torch.profiler.profile.export_chrome_trace = export_chrome_trace
    elif fault == "readonly":
        # root ignores permission bits: answer mkdir inside the folder the way the kernel would for a user.
        folder, real_mkdir = os.path.realpath(target), os.mkdir
        def mkdir(path, *args, **kwargs):
            if os.path.realpath(path).startswith(folder + os.sep):
                raise PermissionError(13, "Permission denied", str(path))
            return real_mkdir(path, *args, **kwargs)
        os.mkdir = mkdir

    from torchscope.cli import main
    sys.exit(main(cli_args))
    """
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120
    )


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("torchscope: warning:")]


def load_events(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["traceEvents"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("faults")
    (path / "train.py").write_text(TRAIN)
    (path / "slow.py").write_text(SLOW)
    (path / "wrapper.py").write_text(WRAPPER)
    return path


@pytest.fixture(scope="module")
def plain(workdir: Path) -> subprocess.CompletedProcess[str]:
    result = _run(["train.py"], workdir)
    assert result.returncode == 5
    return result


def run_with_fault(workdir: Path, fault: str, out: Path) -> subprocess.CompletedProcess[str]:
    args = ["run", "--no-report", "--out", str(out), "train.py"]
    return _run(["wrapper.py", fault, str(out), *args], workdir)


def assert_script_unchanged(result: subprocess.CompletedProcess[str], plain: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == plain.returncode == 5, result.stderr
    assert result.stdout == plain.stdout
    assert "the script's stderr" in result.stderr
    assert "Traceback" not in result.stderr


def test_profiler_fails_to_start(workdir: Path, plain: subprocess.CompletedProcess[str]) -> None:
    out = workdir / "start"
    result = run_with_fault(workdir, "start", out)
    assert_script_unchanged(result, plain)
    [warning] = warnings_of(result.stderr)
    assert "torch.profiler failed to start" in warning and "injected" in warning
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["trace_files"] == [] and manifest["exit_code"] == 5
    assert "injected" in manifest["errors"][0]


def test_trace_handler_raises(workdir: Path, plain: subprocess.CompletedProcess[str]) -> None:
    out = workdir / "handler"
    result = run_with_fault(workdir, "handler", out)
    assert_script_unchanged(result, plain)
    [warning] = warnings_of(result.stderr)
    assert "could not write a trace file" in warning and "No space left on device" in warning
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["trace_files"] == [] and "No space left on device" in manifest["errors"][0]
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]  # no half-written trace left behind


def test_read_only_output_folder(workdir: Path, plain: subprocess.CompletedProcess[str]) -> None:
    out = workdir / "readonly"
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.geteuid() == 0:
            result = run_with_fault(workdir, "readonly", out)
        else:
            result = _run(["-m", "torchscope", "run", "--no-report", "--out", str(out), "train.py"], workdir)
    finally:
        out.chmod(0o755)
    assert_script_unchanged(result, plain)
    [warning] = warnings_of(result.stderr)
    assert "cannot create a run directory" in warning and "Permission denied" in warning
    assert list(out.iterdir()) == []


def _interrupt(workdir: Path, out: Path, signum: int) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchscope", "run", "--no-report", "--active", "1000", "--out", str(out), "slow.py"],
        cwd=workdir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "in the active window\n"
        time.sleep(0.5)  # a few more recorded steps
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, "in the active window\n" + stdout, stderr)


def _assert_partial_capture(out: Path) -> None:
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "interrupted"
    [trace] = manifest["trace_files"]
    events = load_events(out / trace)  # loadable JSON
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) >= 4 and any(e.get("name") == "torchscope:forward" for e in events)


def test_sigint_in_the_active_window(workdir: Path) -> None:
    out = workdir / "sigint"
    result = _interrupt(workdir, out, signal.SIGINT)
    # Python itself ends with the KeyboardInterrupt traceback and by SIGINT (status 130 in a shell).
    assert result.returncode == -signal.SIGINT, result.stderr
    assert result.stderr.rstrip().splitlines()[-2] == "KeyboardInterrupt"  # then the run-directory line
    assert result.stdout == "in the active window\n"
    _assert_partial_capture(out)


def test_sigterm_in_the_active_window(workdir: Path) -> None:
    out = workdir / "sigterm"
    result = _interrupt(workdir, out, signal.SIGTERM)
    assert result.returncode == -signal.SIGTERM  # killed by SIGTERM, as without torchscope
    assert result.stdout == "in the active window\n"
    [warning] = warnings_of(result.stderr)
    assert "SIGTERM" in warning and str(out) in warning
    _assert_partial_capture(out)
