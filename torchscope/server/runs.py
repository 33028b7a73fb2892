"""The runs under a logdir: which folders are runs, where a request path may lead (never outside the
logdir: no `..`, no symlink out), and each run's summary and dashboard, analysed on demand.

A folder is a run when it holds a manifest (`run.json`, `run.rank<R>.json`) or trace files itself; the
search does not descend into a run (its `variants/` are its own business), nor into hidden folders, nor
through symlinked folders.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from torchscope.errors import InputError
from torchscope.rundir.layout import is_manifest_name, is_trace_name, may_hold_traces

MAX_DEPTH = 4  # folders below the logdir searched for runs


class RunSummary(msgspec.Struct, frozen=True):
    """One row of the run list."""

    name: str  # path relative to the logdir, with `/`
    date: str  # newest file's modification time, UTC
    mean_step_us: float | None
    top_finding: str
    error: str = ""


def find_runs(logdir: Path) -> list[str]:
    """Every run under `logdir`, as paths relative to it (sorted)."""
    root = logdir.resolve()
    found: list[str] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        if any(is_manifest_name(f) or is_trace_name(f) for f in files) and _confined(root, here, files):
            found.append(here.relative_to(root).as_posix() or ".")
            dirs[:] = []  # a run's sub-folders belong to it
            continue
        dirs[:] = [d for d in dirs if may_hold_traces(d) and depth < MAX_DEPTH]
    return sorted(found)


def _confined(root: Path, folder: Path, files: list[str]) -> bool:
    """Nothing discovery would read in the run (its files, and those of its sub-folders, which discovery
    follows through symlinks) leads out of the logdir."""
    for name in files:
        if is_trace_name(name) or is_manifest_name(name):
            if not (folder / name).resolve().is_relative_to(root):
                return False
    for below, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if may_hold_traces(d)]
        for name in (*dirs, *names):
            path = Path(below) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                return False
    return True


def resolve_run(logdir: Path, name: str) -> Path:
    """The folder of run `name` (relative, `/`-separated); InputError unless it is a run in the logdir."""
    parts = name.split("/")
    if name != "." and any(p in ("", ".", "..") or p.startswith(".") for p in parts):  # `..`, hidden, absolute
        raise InputError(f"{name!r}: not a run of this logdir")
    root = logdir.resolve()
    folder = (root / name).resolve()
    if not folder.is_relative_to(root) or name not in find_runs(logdir):
        raise InputError(f"{name!r}: not a run of this logdir")
    return folder


def _fingerprint(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and mtimes of the run's files: a run still being written renders anew."""
    entries = []
    for entry in os.scandir(folder):
        if entry.is_file() and (is_trace_name(entry.name) or is_manifest_name(entry.name)):
            info = entry.stat()
            entries.append((entry.name, info.st_size, info.st_mtime_ns))
    return tuple(sorted(entries))


class RunCache:
    """Each run's analysis (Report and sidecars), kept while its files are unchanged. Analyses run one at
    a time with jobs=1: a threaded server's process pools would come from a fork server, and the
    pipeline's own caches already make a repeat cheap."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[Any, Any]] = {}

    def analysis(self, name: str) -> Any:
        """The `RunAnalysis` of run `name` (InputError if it is not a run or cannot be analysed)."""
        from torchscope.pipeline.analyze import analyze_run

        folder = resolve_run(self.logdir, name)
        key = _fingerprint(folder)
        with self._lock:
            cached = self._runs.get(name)
            if cached is not None and cached[0] == key:
                return cached[1]
            result = analyze_run(folder, jobs=1)
            self._runs[name] = (key, result)
            return result

    def summary(self, name: str) -> RunSummary:
        """The run-list row of run `name`; an analysis error becomes its `error` text."""
        folder = resolve_run(self.logdir, name)
        date = _newest_mtime(folder)
        try:
            report = self.analysis(name).report
        except InputError as exc:
            return RunSummary(name, date, None, "", error=str(exc))
        step = next((m.value for m in report.metrics if m.name == "step_time.mean_us"), None)
        top = report.findings[0].title if report.findings else "no finding"
        return RunSummary(name, date, step, top)


def _newest_mtime(folder: Path) -> str:
    times = [e.stat().st_mtime for e in os.scandir(folder) if e.is_file()]
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(max(times))) if times else ""
