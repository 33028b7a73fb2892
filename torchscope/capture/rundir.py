"""Where a run directory goes, and which rank this process is.

Torch-free on purpose: the CLI uses it before torch is imported, and its rules are unit-testable.

Rules (docs/run-directory.md):

* ``out`` does not exist: it becomes the run directory.
* ``out`` exists: a new folder ``<name>-<YYYYmmdd-HHMMSS>[-N]`` inside it, made with an exclusive
  ``mkdir`` so that concurrent runs never share (and clobber) one; when ``out`` is itself a run directory
  (it holds a manifest or a trace), a sibling ``<out>-N`` instead, so a run is never merged into another.
* Distributed (world size > 1): every rank of one launch must pick the same folder without talking to
  the others, so the name comes from the launch (``TORCHELASTIC_RUN_ID``, else the launcher's pid and
  start time) instead of the clock, and ranks join the folder instead of racing for it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Mapping

import msgspec

from torchscope.errors import CaptureError
from torchscope.rundir import layout

_MAX_SUFFIX = 1000


class DistEnv(msgspec.Struct, frozen=True):
    """The process's place in a distributed launch (0/1/0 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    run_id: str | None = None  # TORCHELASTIC_RUN_ID, unless unset or "none"
    launcher_pid: int | None = None  # the parent process (the torchrun agent) when distributed

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(environ: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(environ.get(key, ""))
    except ValueError:
        return default


def dist_env_from(environ: Mapping[str, str], parent_pid: int) -> DistEnv:
    """Read rank/world size from the variables torchrun (and most launchers) set."""
    world_size = max(1, _int(environ, "WORLD_SIZE", 1))
    rank = _int(environ, "RANK", 0)
    local_rank = _int(environ, "LOCAL_RANK", rank)
    local_world_size = max(1, _int(environ, "LOCAL_WORLD_SIZE", world_size))
    run_id = environ.get("TORCHELASTIC_RUN_ID") or None
    if run_id is not None and run_id.lower() == "none":
        run_id = None
    return DistEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        run_id=run_id,
        launcher_pid=parent_pid if world_size > 1 else None,
    )


def detect_dist_env() -> DistEnv:
    """The environment's view, or an already initialised ``torch.distributed`` process group's."""
    env = dist_env_from(os.environ, os.getppid())
    if env.distributed or "torch.distributed" not in sys.modules:
        return env  # never import torch here
    dist = sys.modules["torch.distributed"]
    try:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            rank, world = dist.get_rank(), dist.get_world_size()
            return DistEnv(rank, world, rank, world, env.run_id, os.getppid())
    except Exception:  # a half-initialised group: fall back to the environment
        pass
    return env


def worker_name(env: DistEnv, host: str | None = None, pid: int | None = None) -> str:
    """This process's trace file prefix (:func:`torchscope.rundir.layout.worker_name`), from a safe host name."""
    host = safe_name(host or socket.gethostname(), "host")
    return layout.worker_name(host, env.rank if env.distributed else None, os.getpid() if pid is None else pid)


def safe_name(text: str, default: str = "run") -> str:
    """A file-name-safe version of user text: no separators, no leading dots, bounded length."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:64]
    return cleaned or default


def choose_run_dir(out: str | os.PathLike[str], name: str, env: DistEnv, now: float | None = None) -> Path:
    """Create and return the run directory for this process (see the module docstring).

    Raises :class:`CaptureError` when no directory can be created (permissions, a file in the way).
    """
    out_path = Path(out)
    try:
        if env.distributed:
            return _join_launch_dir(out_path, safe_name(name), launch_tag(env))
        return _exclusive_run_dir(out_path, safe_name(name), now)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CaptureError(f"cannot create a run directory in {out_path}: {reason}") from exc


def _exclusive_run_dir(out: Path, name: str, now: float | None) -> Path:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            out.mkdir()  # exclusive: a concurrent run that got here first keeps it
            return out
        except FileExistsError:
            pass
    if not out.is_dir():
        raise NotADirectoryError(20, "not a directory", str(out))
    if _holds_a_run(out):
        return _sibling_run_dir(out)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    for n in range(_MAX_SUFFIX):
        candidate = out / (f"{name}-{stamp}" if n == 0 else f"{name}-{stamp}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(17, "too many runs with the same name and time", str(out))


def _holds_a_run(folder: Path) -> bool:
    """Whether `folder` is itself a run directory (a manifest or a trace in it): a new run inside it
    would be read as more ranks of that run."""
    try:
        return any(layout.is_manifest_name(e.name) or layout.TRACE_NAME.match(e.name) for e in os.scandir(folder))
    except OSError:
        return False


def _sibling_run_dir(out: Path) -> Path:
    """`<out>-2`, `<out>-3`, ...: a run directory of its own beside an earlier run's (exclusive mkdir)."""
    for n in range(2, _MAX_SUFFIX):
        candidate = out.with_name(f"{out.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(17, "too many runs beside this one", str(out))


def _join_launch_dir(out: Path, name: str, tag: str) -> Path:
    if _is_launch_dir(out, tag):
        return out
    if not out.exists():
        # Build the folder with its marker aside, then rename it into place: the rename is atomic and
        # fails for every rank but one, so no rank ever sees `out` without the marker.
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.{tag}.{os.getpid()}.tmp"
        staging.mkdir(parents=True, exist_ok=True)
        (staging / layout.LAUNCH_MARKER).write_text(tag + "\n")
        try:
            os.rename(staging, out)
            return out
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
        if _is_launch_dir(out, tag):
            return out
    if not out.is_dir():
        raise NotADirectoryError(20, "not a directory", str(out))
    run_dir = out / f"{name}-{tag}"
    run_dir.mkdir(exist_ok=True)  # shared by all ranks of this launch
    return run_dir


def _is_launch_dir(path: Path, tag: str) -> bool:
    try:
        return (path / layout.LAUNCH_MARKER).read_text().strip() == tag
    except OSError:
        return False


def launch_tag(env: DistEnv) -> str:
    """A name shared by all ranks of one launch and different for the next launch.

    ``TORCHELASTIC_RUN_ID`` when torchrun was given one (``--standalone`` makes a uuid); otherwise the
    launcher's pid, prefixed with its start time so that a reused pid never joins an old folder.
    """
    stamp = process_start_stamp(env.launcher_pid) if env.launcher_pid else None
    if env.run_id:
        ident = safe_name(env.run_id)[:12]
    else:
        ident = f"p{env.launcher_pid or os.getppid()}"
    return f"{stamp}-{ident}" if stamp else ident


def process_start_stamp(pid: int) -> str | None:
    """``YYYYmmdd-HHMMSS`` (local time) when process ``pid`` started; Linux only, else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # Field 22 (starttime, clock ticks after boot); split after the ")" that ends the command name.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot_time = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        started = boot_time + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
