"""The report printed at the end of ``torchscope run`` / ``torchscope demo``.

The analysis and rendering are imported when used (`torchscope run` must not pay for them before the
script runs), and every failure (not installed, no trace, a bug) becomes one
``torchscope: warning:`` line: the report is a bonus after the run, never a reason to change its exit code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from torchscope.capture.notices import describe, warn_line
from torchscope.files import write_atomic
from torchscope.rundir.layout import manifest_name

if TYPE_CHECKING:
    from torchscope.pipeline.analyze import RunAnalysis
    from torchscope.report.model import Report

# How long rank 0 waits for the other ranks' manifests before analysing (single-node launches only).
RANK_WAIT_S = 30.0


def wait_for_manifests(run_dir: Path, world_size: int, timeout_s: float = RANK_WAIT_S) -> bool:
    """Wait until ``run.rank<R>.json`` exists for every rank (they are written last). True if all came."""
    deadline = time.monotonic() + timeout_s
    expected = [run_dir / manifest_name(rank, distributed=True) for rank in range(world_size)]
    while True:
        if all(path.exists() for path in expected):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def build_report(run_dir: Path) -> Report | None:
    """The run directory's Report, or None (and one warning line) if the analysis fails."""
    run = build_run(run_dir)
    return run.report if run is not None else None


def build_run(run_dir: Path) -> RunAnalysis | None:
    """The run directory's Report and sidecars, or None (and one warning line) if the analysis fails."""
    try:
        from torchscope.pipeline.analyze import analyze_run

        return analyze_run(run_dir)
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not build the report for {run_dir}: {describe(exc)}")
    return None


def render(report: Report, format: str, width: int | None = None) -> str | None:
    """`report` in `format` (a registered renderer), or None (and one warning line)."""
    try:
        from torchscope.render.registry import RenderOptions, renderer

        return renderer(format).render(report, RenderOptions(width=width))
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not render the report: {describe(exc)}")
    return None


def write_html(run: RunAnalysis | None, path: Path) -> bool:
    """Write the dashboard of `run` (Report and timeline sidecar) to `path`; False (and a warning) on failure."""
    if run is None:
        return False
    try:
        from torchscope.render.html import render_html

        write_atomic(path, render_html(run.report, run.sidecars).encode("utf-8"))
        return True
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not write {path}: {describe(exc)}")
    return False


def write_report(report: Report, path: Path, format: str = "json") -> bool:
    """Write `report` in `format` to `path` atomically; False (and one warning line) on failure."""
    text = render(report, format)
    if text is None:
        return False
    try:
        write_atomic(path, (text if text.endswith("\n") else text + "\n").encode("utf-8"))
        return True
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not write {path}: {describe(exc)}")
    return False
