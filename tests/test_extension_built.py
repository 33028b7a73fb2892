"""The compiled scanner is built and the loader hands it its batches. Where the project's CI runs, it must
be built (tests/unit/test_fastscan.py skips without it, and every parse would silently take the slower
msgspec path); elsewhere a missing compiler is allowed, but a built scanner must still be in use."""

from __future__ import annotations

import os
from typing import Any

import pytest

from helpers.real_traces import TraceSet
from torchscope.trace import fastscan
from torchscope.trace.parse import parse_trace

REQUIRED = os.environ.get("TORCHSCOPE_REQUIRE_FASTSCAN") == "1"  # set by .ci/run


def test_the_compiled_scanner_is_built_and_used(real_traces: TraceSet, monkeypatch: pytest.MonkeyPatch) -> None:
    if fastscan._fastscan is None and not REQUIRED:
        pytest.skip("the compiled scanner is not built (no C compiler at install time); "
                    "only TORCHSCOPE_REQUIRE_FASTSCAN=1 (.ci/run) requires it")
    assert fastscan._fastscan is not None, "torchscope/trace/_fastscan.c did not build (is a C compiler installed?)"
    if not fastscan.available() and not REQUIRED:
        pytest.skip(f"the compiled scanner is disabled by {fastscan.DISABLE_ENV}")
    assert fastscan.available(), f"the compiled scanner is disabled by {fastscan.DISABLE_ENV}"
    accepted: list[bool] = []
    scan = fastscan.BatchScanner.scan

    def counted(self: fastscan.BatchScanner, *args: Any) -> Any:
        result = scan(self, *args)
        accepted.append(result is not None)
        return result

    monkeypatch.setattr(fastscan.BatchScanner, "scan", counted)
    trace = parse_trace(real_traces.file("resnet50_num_workers_0"))
    assert len(trace.events) > 10_000
    assert accepted and all(accepted), f"the scanner took {sum(accepted)} of {len(accepted)} batches of a real trace"
