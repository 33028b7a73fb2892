"""Find trace files under a path and group them by worker (rank) and span.

Accepted: one trace file (`.json`, `.json.gz`), a directory of traces, or a run directory. File names
follow `torch.profiler.tensorboard_trace_handler`: `<worker>.<timestamp_ms>.pt.trace.json[.gz]`; several
files of one worker are consecutive schedule cycles ("spans"). The rank comes from the trace header
(`distributedInfo.rank`), else from a `rank<N>` in the worker name, else the manifest, else the order.
Names are the run directory's (torchscope.rundir.layout): manifests, reports, hidden folders (caches),
`sidecars/` (extra data) and `variants/` (runs of their own) below the given path are not read as traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchscope.errors import InputError
from torchscope.rundir import layout

MAX_DEPTH = 3


@dataclass(frozen=True)
class TraceFileRef:
    path: Path
    worker: str
    span_key: str  # sorts spans of one worker in capture order
    rank_hint: int | None


def discover(path: Path) -> list[TraceFileRef]:
    """Trace files at `path`, sorted by worker then span. Raises InputError when there are none."""
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if path.is_file():
        return [_ref(path)]
    files = sorted(_walk(path, 0))
    if not files:
        raise InputError(f"{path}: no trace files (*.json, *.json.gz) found")
    return sorted((_ref(f) for f in files), key=lambda r: (r.worker, r.span_key, str(r.path)))


def _walk(directory: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise InputError(f"{directory}: cannot list directory ({exc.strerror or exc})") from None
    for entry in entries:
        if entry.is_dir():
            if depth < MAX_DEPTH and layout.may_hold_traces(entry.name):
                found.extend(_walk(entry, depth + 1))
        elif entry.is_file() and layout.is_trace_name(entry.name):
            found.append(entry)
    return found


def _ref(path: Path) -> TraceFileRef:
    match = layout.TRACE_NAME.match(path.name)
    if match:
        worker, span = match.group("worker"), match.group("span") or ""
    else:
        worker, span = path.name.removesuffix(".gz").removesuffix(".json"), ""
    rank = layout.RANK_IN_WORKER.search(worker)
    return TraceFileRef(path, worker, span.rjust(20, "0"), int(rank.group(1)) if rank else None)
