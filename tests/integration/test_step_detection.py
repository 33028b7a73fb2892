"""Steps under `torchscope run` for loops with no optimizer object and no DataLoader (issue 13).

Real CPU training loops run as subprocesses: manual SGD (the update written by hand after
`loss.backward()`), a loop that only evaluates a model (no backward either), and a script that marks its
steps with `torchscope.step()`. Each must give at least 3 recorded steps, each step one iteration of the
loop (one backward per step, read from the trace), and a breakdown that adds up to the step time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

MANUAL_SGD = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
criterion = torch.nn.CrossEntropyLoss()  # a module too: a second top-level forward per iteration
data, target = torch.randn(2048, 32), torch.randint(0, 10, (2048,))
for i in range(0, 2048, 128):
    model.zero_grad()
    loss = criterion(model(data[i:i + 128]), target[i:i + 128])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
"""

EVALUATE_ONLY = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).eval()
head = torch.nn.Softmax(dim=1)
with torch.no_grad():
    for i in range(12):
        x = torch.randn(256, 32)  # made in the loop: no DataLoader
        probs = head(model(x))
"""

MARKED = """
import torch, torchscope
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 32), torch.randn(128, 1)
for i in range(10):
    for micro in range(2):  # two optimizer steps per marked step: the marker decides, not the optimizer
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torchscope.step()
"""


ACCUMULATION = """
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,))), batch_size=32)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for i, (x, y) in enumerate(loader):
    (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
    if (i + 1) % 4 == 0:  # gradient accumulation over 4 micro-batches
        opt.step()
        opt.zero_grad()
    if i == 40:
        break
"""

# Reinforcement learning: a rollout of 50 policy calls without gradients, then an update. The rollout
# comes before the first optimizer step, and past 32 held calls each call became a step: the recorded
# window held single policy calls (29 steps seen for 12 iterations).
ROLLOUT = """
import torch
torch.manual_seed(0)
policy = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
for iteration in range(12):
    observations = [torch.randn(1, 8)]
    with torch.no_grad():
        for t in range(50):
            action = policy(observations[-1]).argmax()
            observations.append(torch.randn(1, 8) + action)
    loss = policy(torch.cat(observations)).logsumexp(1).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def _run_script(tmp_path: Path, source: str, report: tuple[str, ...] = ("--no-report",)) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torchscope", "run", *report, "--no-stack", "--out", str(out), str(script)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    if report != ("--no-report",):  # the report is on stderr, at the --width asked for
        lines = [line for line in done.stderr.splitlines() if not line.startswith("torchscope:")]
        assert "Step time breakdown (mean per step)" in done.stderr
        assert max(map(len, lines)) <= int(report[-1])
    return out


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def _labels_per_step(run_dir: Path, label: str) -> list[int]:
    """How many `label` ranges start inside each ProfilerStep of the trace."""
    (trace,) = run_dir.glob("*.pt.trace.json")
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))
    starts = [e["ts"] for e in events if e["name"] == label]
    return [sum(lo <= ts < hi for ts in starts) for lo, hi in steps]


def _check_report(run_dir: Path) -> None:
    from torchscope.pipeline.analyze import analyze

    report = analyze([str(run_dir)], use_cache=False)
    assert report.run.step_source == "profiler_step"
    assert len(report.steps) >= 3
    for step in report.steps:
        assert sum(step.breakdown.values()) == pytest.approx(step.duration_us, rel=0.01)


def test_manual_sgd_steps_from_backward(tmp_path: Path) -> None:
    run_dir = _run_script(tmp_path, MANUAL_SGD, report=("--width", "72"))
    assert _manifest(run_dir)["options"]["step_marking"] == "backward"
    assert _labels_per_step(run_dir, "torchscope:backward") == [1, 1, 1]
    assert _labels_per_step(run_dir, "torchscope:forward") == [2, 2, 2]  # the model and the criterion
    _check_report(run_dir)


def test_loop_without_optimizer_dataloader_or_backward(tmp_path: Path) -> None:
    run_dir = _run_script(tmp_path, EVALUATE_ONLY)
    assert _manifest(run_dir)["options"]["step_marking"] == "module"
    assert _labels_per_step(run_dir, "torchscope:forward") == [2, 2, 2]  # the model and the softmax head
    _check_report(run_dir)


def test_torchscope_step_marks_the_steps(tmp_path: Path) -> None:
    run_dir = _run_script(tmp_path, MARKED)
    manifest = _manifest(run_dir)
    assert manifest["options"]["step_marking"] == "manual"
    assert manifest["steps_seen"] >= 9
    assert _labels_per_step(run_dir, "torchscope:optimizer") == [2, 2, 2]
    _check_report(run_dir)


def test_gradient_accumulation_steps_are_optimizer_steps(tmp_path: Path) -> None:
    # Before the first optimizer step the DataLoader rule marked each micro-batch a step: the window held a
    # single micro-batch, then one with the optimizer's first step. Held while the optimizer had not stepped.
    run_dir = _run_script(tmp_path, ACCUMULATION)
    assert _manifest(run_dir)["options"]["step_marking"] == "optimizer"
    assert _labels_per_step(run_dir, "torchscope:optimizer") == [1, 1, 1]
    assert _labels_per_step(run_dir, "torchscope:backward") == [4, 4, 4]
    _check_report(run_dir)


def test_a_rollout_before_the_first_update_is_not_cut_into_steps(tmp_path: Path) -> None:
    run_dir = _run_script(tmp_path, ROLLOUT)
    manifest = _manifest(run_dir)
    assert manifest["options"]["step_marking"] == "optimizer"
    assert manifest["steps_seen"] == 11  # one per update but the last (whose step the end of the run closes)
    assert _labels_per_step(run_dir, "torchscope:optimizer") == [1, 1, 1]
    assert _labels_per_step(run_dir, "torchscope:backward") == [1, 1, 1]
    _check_report(run_dir)


def test_an_optimizer_that_never_steps_beside_model_calls_alone_is_said(tmp_path: Path) -> None:
    # The price of holding a rollout however long: model calls alone, beside an optimizer that never steps,
    # give no steps; the capture says why instead of recording single calls.
    script = ROLLOUT.replace("opt.step()", "pass").replace("loss.backward()", "pass")
    script = script.replace("loss = policy(", "# loss = policy(").replace("opt.zero_grad()", "pass")
    (tmp_path / "evaluate.py").write_text(script)
    done = subprocess.run([sys.executable, "-m", "torchscope", "run", "--no-report", "--out", str(tmp_path / "run"),
                           "evaluate.py"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=180)
    assert "599 step boundaries" in done.stderr  # 600 calls: the first one anchors the pattern
    assert "held for the optimizer the script built, which never stepped" in done.stderr, done.stderr


def test_one_update_after_a_long_rollout_is_not_told_the_optimizer_never_stepped(tmp_path: Path) -> None:
    script = ROLLOUT.replace("range(12)", "range(1)").replace("range(50)", "range(100)")
    (tmp_path / "once.py").write_text(script)
    done = subprocess.run([sys.executable, "-m", "torchscope", "run", "--no-report", "--out", str(tmp_path / "run"),
                           "once.py"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=180)
    assert "no trace was written" in done.stderr and "never stepped" not in done.stderr, done.stderr
