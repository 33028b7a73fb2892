"""Run a training script under `torchrun --standalone -m torchscope run` on the CPU (gloo), as a user would,
for the multi-rank capture tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

REPO = Path(__file__).resolve().parents[2]


def torchrun_capture(
    cwd: Path, source: str, ranks: int, env: Mapping[str, str] | None = None, timeout: int = 180
) -> subprocess.CompletedProcess[str]:
    """Write `source` to `cwd/train.py` and run it on `ranks` local ranks under `torchscope run --no-report
    --out runs`, this checkout first on the path; check that it exited 0 and return the finished process."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "train.py").write_text(source)
    environment = dict(os.environ, **(env or {}))
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), environment.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               "-m", "torchscope", "run", "--no-report", "--out", "runs", "train.py"]
    done = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done
