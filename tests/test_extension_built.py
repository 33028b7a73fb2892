"""Where the project's CI runs, the compiled scanner must be built (tests/unit/test_fastscan.py skips
without it, and every parse would silently take the slower msgspec path)."""

from __future__ import annotations

import os

import pytest

from torchscope.trace import fastscan


@pytest.mark.skipif(os.environ.get("TORCHSCOPE_REQUIRE_FASTSCAN") != "1",
                    reason="only where TORCHSCOPE_REQUIRE_FASTSCAN=1 (set by .ci/run): elsewhere a missing compiler is allowed")
def test_the_compiled_scanner_is_built_and_used() -> None:
    assert fastscan._fastscan is not None, "torchscope/trace/_fastscan.c did not build (is a C compiler installed?)"
    assert fastscan.available()
