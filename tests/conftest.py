"""Shared test fixtures: real Kineto traces (tests/helpers/real_traces.py) and an isolated cache.

`real_traces`: the full traces in ../shared/traces (or $TORCHSCOPE_SHARED_TRACES) when present, else the
tiny real cuts committed under tests/data/traces; never skips. `shared_traces`: the full traces only, for
figures known only for them; skipped, with the reason, when absent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # `from helpers.trace_builder import TraceBuilder`

from helpers.real_traces import TraceSet, shared_missing_reason, shared_root, trace_set  # noqa: E402


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    reason = shared_missing_reason()
    if reason:
        pytest.skip(reason)
    return shared_root()


@pytest.fixture(scope="session")
def real_traces() -> TraceSet:
    return trace_set()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed-trace caches must not land in the read-only ../shared folder nor in the user's home."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
