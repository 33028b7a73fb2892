"""The names of everything in a run directory, for the capture that writes it and the readers.

```
runs/train-20261130-031500/                   <- the run directory
  run.json | run.rank<R>.json                 <- manifest: one per process (rank files when distributed)
  <worker>.<timestamp_ms>.pt.trace.json[.gz]  <- Kineto traces, tensorboard_trace_handler names
  report.json                                 <- the JSON report (`torchscope demo`)
  report.html                                 <- the dashboard (`torchscope run`, `demo`)
  sidecars/                                   <- per-run extra data (timeline lanes, ...), never read as traces
  variants/<name>/                            <- tuning variants, each a run directory of its own
  .torchscope-launch                          <- marker: the ranks of one torchrun launch share this folder
  .torchscope-cache/                          <- tables cached from the traces
```

Names that start with a dot are torchscope's private files (markers, caches, temporary files while a trace
or manifest is written) and are never read as traces.
"""

from __future__ import annotations

import re

MANIFEST_NAME = "run.json"
_MANIFEST_PATTERN = re.compile(r"^run(?:\.rank\d+)?\.json$")

TRACE_SUFFIX = ".pt.trace.json"  # what the capture writes (tensorboard_trace_handler's layout)
TRACE_FILE_SUFFIXES = (".json", ".json.gz")  # what discovery accepts: other tools name their traces freely
# `<worker>.<timestamp_ms>.pt.trace.json[.gz]`; the timestamp orders one worker's schedule cycles ("spans").
TRACE_NAME = re.compile(r"^(?P<worker>.*?)(?:\.(?P<span>\d+))?\.pt\.trace\.json(?:\.gz)?$")
# The rank in a worker name: torchscope's `<host>_rank<R>`, and `rank-<R>` / `rank<R>` of other tools.
RANK_IN_WORKER = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)

REPORT_NAME = "report.json"
HTML_REPORT_NAME = "report.html"  # the self-contained dashboard (render/html.py)
LAUNCH_MARKER = ".torchscope-launch"
CACHE_DIR = ".torchscope-cache"
SIDECARS_DIR = "sidecars"
VARIANTS_DIR = "variants"

# JSON files that other tools write beside their traces (besides our manifests and report).
_FOREIGN_NOT_TRACES = ("manifest.json",)
_FOREIGN_REPORT_SUFFIX = ".report.json"
# Sub-folders that hold no traces of this run: extra data, and other runs (the variants).
_NOT_TRACE_DIRS = frozenset({SIDECARS_DIR, VARIANTS_DIR})


def sidecar_name(name: str) -> str:
    """File, under ``sidecars/``, of the run-level data an analysis keeps out of the report (e.g. timeline lanes)."""
    return f"{name}.msgpack"


def memory_snapshot_name(worker: str) -> str:
    """``<worker>.memory_snapshot.pickle``: the CUDA memory snapshot ``run --memory-snapshot`` writes
    (``torchscope memory`` reads it; discovery never takes it for a trace)."""
    return f"{worker}.memory_snapshot.pickle"


def manifest_name(rank: int, distributed: bool) -> str:
    """``run.json`` for a single process, ``run.rank<R>.json`` for each rank of a distributed run."""
    return f"run.rank{rank}.json" if distributed else MANIFEST_NAME


def is_manifest_name(name: str) -> bool:
    """Whether ``name`` is a manifest's file name (``run.json`` or ``run.rank<R>.json``)."""
    return _MANIFEST_PATTERN.match(name) is not None


def worker_name(host: str, rank: int | None, pid: int) -> str:
    """The trace files' prefix: ``<host>_rank<R>`` for a rank of a distributed run, else ``<host>_<pid>``."""
    return f"{host}_rank{rank}" if rank is not None else f"{host}_{pid}"


def trace_name(worker: str, timestamp_ms: int) -> str:
    """``<worker>.<timestamp_ms>.pt.trace.json``: the file one schedule cycle of ``worker`` is saved to."""
    return f"{worker}.{timestamp_ms}{TRACE_SUFFIX}"


def is_trace_name(name: str) -> bool:
    """Whether discovery reads a file of this name as a trace: JSON, not hidden, not a manifest or report."""
    if name.startswith(".") or not name.endswith(TRACE_FILE_SUFFIXES):
        return False
    return not (
        is_manifest_name(name)
        or name == REPORT_NAME
        or name in _FOREIGN_NOT_TRACES
        or name.endswith(_FOREIGN_REPORT_SUFFIX)
    )


def may_hold_traces(folder: str) -> bool:
    """Whether discovery looks for traces in a sub-folder of this name: not hidden (caches), not
    ``sidecars/`` (extra data) and not ``variants/`` (other runs, analysed on their own)."""
    return not folder.startswith(".") and folder not in _NOT_TRACE_DIRS
