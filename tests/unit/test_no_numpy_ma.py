"""Analysing a trace does not import numpy.ma (13-18 ms of CPU a process): np.median, np.nanmedian and the
plain np.unique load it on first use, so the analyses use arrays.median / nanmedian / distinct instead.

The real CPU-only two-step gloo trace exercises the per-span extracts and the run-level reduces (rank
summaries, straggler, collectives); GPU traces still load it through what-if's np.median (whatif.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "cpu" / "hta_cpu_only_gloo"


def test_analysing_a_cpu_trace_never_imports_numpy_ma() -> None:
    code = (
        "import sys\nfrom torchscope.pipeline.analyze import analyze\n"
        f"report = analyze({str(TRACE)!r}, jobs=1, use_cache=False)\n"
        "assert report.steps, 'nothing analysed'\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", "an analysis imported numpy.ma"
