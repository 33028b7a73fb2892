"""Find trace files under a path and group them by worker (rank) and span.

Accepted: one trace file (`.json`, `.json.gz`), a directory of traces, or a run directory. File names
follow `torch.profiler.tensorboard_trace_handler`: `<worker>.<timestamp_ms>.pt.trace.json[.gz]`; several
files of one worker are consecutive schedule cycles ("spans"). The rank comes from the trace header
(`distributedInfo.rank`), else from a `rank<N>` in the worker name, else the manifest, else the order.
Names are the run directory's (torchscope.rundir.layout): manifests, reports, hidden folders (caches),
`sidecars/` (extra data) and `variants/` (runs of their own) below the given path are not read as traces.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec

from torchscope.errors import InputError
from torchscope.rundir import layout
from torchscope.text import path_text

MAX_DEPTH = 3


class TraceFileRef(msgspec.Struct, frozen=True):
    path: Path
    worker: str
    span_key: str  # sorts spans of one worker in capture order
    rank_hint: int | None


class Discovery(msgspec.Struct):
    """The trace files found under the given paths, and what was skipped on the way (one line each)."""

    refs: list[TraceFileRef] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    _seen: set[tuple[int, int]] = msgspec.field(default_factory=set)  # (device, inode) of files and folders
    _matched: int = 0  # trace files met, counted or not (one seen before is still not "no traces")


def discover(path: Path) -> list[TraceFileRef]:
    """Trace files at `path`, sorted by worker then span. Raises InputError when there are none."""
    return discover_all([path]).refs


def discover_all(paths: list[Path]) -> Discovery:
    """Trace files at every path, each counted once (however many paths, symlinks or loops lead to it),
    sorted by worker then span; folders that cannot be listed below a given path and entries that are
    not regular files become warnings. Raises InputError for a given path that is missing, not a file
    or folder, or holds no trace."""
    found = Discovery()
    for path in paths:
        before = found._matched
        info = _stat(path)
        if stat.S_ISDIR(info.st_mode):
            if (info.st_dev, info.st_ino) in found._seen:
                continue  # the same folder given twice: walked once
            _walk_top(path, info, found)
            if found._matched == before:
                raise InputError(f"{path}: no trace files (*.json, *.json.gz) found")
        elif stat.S_ISREG(info.st_mode):
            _add_file(path, info, found)
        else:
            raise InputError(f"{path}: {_kind(info.st_mode)}, not a trace file or folder")
    found.refs.sort(key=lambda r: (r.worker, r.span_key, str(r.path)))
    return found


def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)  # follows symlinks: a link to a trace is a trace
    except FileNotFoundError:
        raise InputError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _walk_top(directory: Path, info: os.stat_result, found: Discovery) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"{directory}: cannot list directory ({exc.strerror or exc})") from None
    found._seen.add((info.st_dev, info.st_ino))
    _visit(directory, entries, 0, found)


def _walk(directory: Path, depth: int, found: Discovery) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:  # a sub-folder we may not read: the others still count
        found.warnings.append(f"{directory}: cannot list directory ({exc.strerror or exc}); skipped")
        return
    _visit(directory, entries, depth, found)


def _visit(directory: Path, entries: list[os.DirEntry[str]], depth: int, found: Discovery) -> None:
    for entry in entries:
        path = directory / entry.name
        try:
            info = entry.stat()  # follows symlinks; a broken one raises
        except OSError as exc:
            if layout.is_trace_name(entry.name):
                found.warnings.append(f"{path}: cannot read ({exc.strerror or exc}); skipped")
            continue
        if stat.S_ISDIR(info.st_mode):
            if depth < MAX_DEPTH and layout.may_hold_traces(entry.name) and (info.st_dev, info.st_ino) not in found._seen:
                found._seen.add((info.st_dev, info.st_ino))  # a symlink loop or a second link is walked once
                _walk(path, depth + 1, found)
        elif layout.is_trace_name(entry.name):
            if stat.S_ISREG(info.st_mode):
                _add_file(path, info, found)
            else:
                found.warnings.append(f"{path}: {_kind(info.st_mode)}, not a trace file; skipped")


def _add_file(path: Path, info: os.stat_result, found: Discovery) -> None:
    found._matched += 1
    if (info.st_dev, info.st_ino) in found._seen:
        return  # the same file given twice, or reached through a link: counted once
    found._seen.add((info.st_dev, info.st_ino))
    found.refs.append(_ref(path))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _ref(path: Path) -> TraceFileRef:
    name = path_text(path.name)  # the worker name reaches the report: undecodable bytes shown as \xff
    match = layout.TRACE_NAME.match(name)
    if match:
        worker, span = match.group("worker"), match.group("span") or ""
    else:
        worker, span = name.removesuffix(".gz").removesuffix(".json"), ""
    rank = layout.RANK_IN_WORKER.search(worker)
    return TraceFileRef(path, worker, span.rjust(20, "0"), int(rank.group(1)) if rank else None)
