"""The package type-checks (mypy, settings in pyproject.toml): type hints are part of the code's contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")
REPO = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "torchscope"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_public_api_is_typed_for_users(tmp_path: Path) -> None:
    """`torchscope.analyze/load/Report/profile` are imported lazily at run time, yet a user's type checker
    sees their real signatures (not `Any`)."""
    user = tmp_path / "user_code.py"
    user.write_text(
        "import torchscope\n"
        "report = torchscope.analyze('runs/x', jobs=2)\n"
        "reveal_type(report)\n"
        "reveal_type(report.findings[0].fixes)\n"
        "reveal_type(torchscope.load)\n"
        "reveal_type(torchscope.profile)\n"
        "torchscope.analyze('x', jobs='two')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(user)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "MYPYPATH": str(REPO)},
    )
    out = done.stdout
    assert "torchscope.report.model.Report" in out, out
    assert "list[torchscope.report.model.Fix]" in out, out
    assert "def (path: str | pathlib.Path, use_cache: bool =) -> dict[str, list[torchscope.trace.tables.TraceFile]]" in out, out
    assert "torchscope.capture.profiler.Profiler" in out, out
    assert 'Argument "jobs" to "analyze" has incompatible type "str"' in out, out
