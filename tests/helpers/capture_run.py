"""Run a small training script under `torchscope run` in a subprocess, as a user would, for the capture tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence


def capture(
    tmp_path: Path, source: str, name: str, *args: str, options: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Path:
    """Write `source` to `tmp_path/name`, run it (with `args`) under `torchscope run --no-report` and the
    capture `options`, check that it exited 0, and return its run directory."""
    script = tmp_path / name
    script.write_text(source)
    out = tmp_path / f"run_{'_'.join(args) or 'default'}"
    command = [sys.executable, "-m", "torchscope", "run", "--out", str(out), "--no-report", *options, str(script), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=None if env is None else dict(env))
    assert done.returncode == 0, done.stderr
    return out
