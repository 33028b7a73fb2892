"""`torchscope tune` on the planted CPU examples: each finding's fix applied without editing the code,
in its own trial process, measured against the baseline (real runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "bottlenecks"


def _tune(script: str, cwd: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run([sys.executable, "-m", "torchscope", "tune", "--format", "json", *extra, str(EXAMPLES / script)],
                          cwd=cwd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_more_dataloader_workers_are_measured_faster(tmp_path: Path) -> None:
    result = _tune("slow_getitem.py", tmp_path)
    data = next(c for c in result["candidates"] if c["finding"] == "data_loading.exposed")
    assert any(f["target"] == "num_workers" for f in data["fixes"])
    assert data["status"] == "faster" and data["significant"] is True
    assert data["speedup"] >= 1.5
    assert result["verdict"].startswith("best: ")


def test_a_foreach_optimizer_is_measured_faster(tmp_path: Path) -> None:
    result = _tune("adam_foreach_false.py", tmp_path, "--active", "4", "--warmup", "1")
    optimizer = next(c for c in result["candidates"] if c["finding"] == "optimizer.step")
    assert any(f["kind"] == "optimizer_kwarg" for f in optimizer["fixes"])
    assert optimizer["status"] == "faster" and optimizer["speedup"] > 1.0


def test_a_script_that_writes_checkpoints_leaves_the_working_directory_alone(tmp_path: Path) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _tune("checkpoint_every_step.py", tmp_path)
    assert result["trials"] >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # the checkpoints went to the trial's folder
