"""The CI snippets of docs/ci.md (GitHub Actions and GitLab) run as written: their commands are read from
the YAML blocks and run with bash on a small real training script standing in for the user's `train.py`.
The first GitHub run has no baseline (the gate is skipped and a baseline is written); the second gates
the same run against that baseline, which must pass; GitLab's step writes its JSON verdict."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

TRAIN = textwrap.dedent(
    """
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    args = parser.parse_args()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randint(0, 8, (512,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    steps = 0
    while steps < args.max_steps:
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == args.max_steps:
                break
    print("trained", steps)
    """
)


def _yaml_block(heading: str) -> str:
    text = (REPO / "docs" / "ci.md").read_text()
    block = re.search(rf"### {re.escape(heading)}\s*```yaml\n(.*?)```", text, re.S)
    assert block, f"docs/ci.md lost its {heading} block"
    return block.group(1)


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _github_steps() -> tuple[str, str]:
    """The capture command and the gate script of the GitHub Actions block."""
    block = _yaml_block("GitHub Actions")
    capture = re.search(r"run: (torchscope run .*)", block)
    gate = re.search(r"name: Gate\n\s+run: \|\n((?:\s{10}.*\n)+)", block)
    assert capture and gate, "the GitHub block's capture or gate step moved"
    return capture.group(1), textwrap.dedent(gate.group(1))


def test_the_github_and_gitlab_snippets_run_as_written(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    capture, gate = _github_steps()
    ran = _bash(capture, tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # --stop-after-active ends the script once the 10 recorded steps are written.
    assert (tmp_path / "runs" / "new" / "run.json").is_file() and "trained" not in ran.stdout

    # First run on the default branch: no baseline yet, so the gate step only writes one.
    first = _bash(gate, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    written = json.loads((tmp_path / "baseline.json").read_text())
    assert len(written["steps"]) == 10  # --active 10
    # The next pipeline downloads it as the artifact: the same run against it passes the gate.
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline.json").rename(tmp_path / "baseline" / "baseline.json")
    second = _bash(gate, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "PASS" in second.stdout

    # GitLab: the check step against a stored baseline writes its verdict as JSON.
    gitlab = [line.strip()[2:] for line in _yaml_block("GitLab CI").splitlines() if line.strip().startswith("- torchscope check")]
    assert len(gitlab) == 1, "the GitLab block's check step moved"
    (tmp_path / "perf").mkdir()
    (tmp_path / "baseline" / "baseline.json").rename(tmp_path / "perf" / "baseline.json")
    checked = _bash(gitlab[0], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    verdict = json.loads((tmp_path / "diff.json").read_text())
    assert verdict["step_time"]["verdict"] == "no significant change" and verdict["step_time"]["change_pct"] == 0.0
