"""The report printed at the end of ``torchscope run`` / ``torchscope demo``.

The analysis side is imported lazily and every failure (not installed, no trace, a bug) becomes one
``torchscope: warning:`` line: the report is a bonus after the run, never a reason to change its exit code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torchscope.capture.notices import describe, warn_line
from torchscope.rundir.layout import manifest_name

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


def build_report(run_dir: Path) -> Any | None:
    """``torchscope.report.build.analyze(run_dir)``, or None (and one warning line) if that fails."""
    try:
        from torchscope.report.build import analyze

        return analyze(run_dir)
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not build the report for {run_dir}: {describe(exc)}")
    return None


def render_terminal(report: Any) -> str | None:
    """The terminal rendering of ``report``, or None (and one warning line)."""
    try:
        from torchscope.render.terminal import render_terminal as render

        return str(render(report, width=None))
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not render the report: {describe(exc)}")
    return None


def write_json_report(report: Any, path: Path) -> bool:
    """Write ``render_json(report)`` to ``path``; False (and one warning line) on failure."""
    try:
        from torchscope.render.json import render_json

        text = render_json(report)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
        tmp.replace(path)
        return True
    except KeyboardInterrupt:
        warn_line("report interrupted")
    except Exception as exc:
        warn_line(f"could not write {path}: {describe(exc)}")
    return False
