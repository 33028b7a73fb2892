"""The package type-checks (mypy, settings in pyproject.toml): type hints are part of the code's contract."""

from __future__ import annotations

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
