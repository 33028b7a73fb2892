"""Shared test fixtures: the real traces in ../shared/traces (skipped, with the reason, when absent)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
sys.path.insert(0, str(REPO / "tests"))  # `from helpers.trace_builder import TraceBuilder`


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (the ../shared folder beside the repo)")
    return SHARED_TRACES


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed-trace caches must not land in the read-only ../shared folder nor in the user's home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
