"""The run manifest (``run.json`` / ``run.rank<R>.json``): what a later analysis needs to know.

Fields are listed in docs/run-directory.md. Written once, at the end of the capture, atomically
(temporary file + ``os.replace``) so that a reader never sees half a manifest.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Literal, TypedDict

from torchscope import __version__

SCHEMA_VERSION = 1

Status = Literal["complete", "interrupted", "error", "stopped"]
StepSource = Literal["manual", "optimizer", "dataloader", "none"]


class Schedule(TypedDict):
    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int


class CaptureOptions(TypedDict):
    record_shapes: bool
    profile_memory: bool
    with_stack: bool
    with_flops: bool
    phase_labels: bool
    step_source: StepSource


class Manifest(TypedDict):
    schema_version: int
    torchscope_version: str
    torch_version: str
    python_version: str
    command: list[str]
    cwd: str
    host: str
    pid: int
    rank: int
    world_size: int
    local_rank: int
    start_time: str
    end_time: str
    schedule: Schedule
    activities: list[str]
    options: CaptureOptions
    trace_files: list[str]
    steps_seen: int
    status: Status
    errors: list[str]
    exit_code: int | None  # the script's exit code under `torchscope run`; None in-code
    environment: dict[str, object]  # what rules need to size their advice (CPUs, threads, cudnn flags)


def capture_environment() -> dict[str, object]:
    """CPUs and threading of this process, read at the end of the capture (never raises)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    env: dict[str, object] = {
        "cpu_count": cpus,
        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    torch_module = sys.modules.get("torch")
    if torch_module is not None:
        try:
            env["torch_num_threads"] = int(torch_module.get_num_threads())
            env["cudnn_benchmark"] = bool(torch_module.backends.cudnn.benchmark)
            env["cuda_devices"] = int(torch_module.cuda.device_count()) if torch_module.cuda.is_available() else 0
        except Exception:  # an exotic build must not cost the manifest
            pass
    return env


def utc_now_iso(timestamp: float | None = None) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2026-11-30T03:15:00.123Z``."""
    now = time.time() if timestamp is None else timestamp
    millis = int(round((now % 1) * 1000)) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"


def build_manifest(
    *,
    command: list[str],
    rank: int,
    world_size: int,
    local_rank: int,
    start_time: str,
    schedule: Schedule,
    activities: list[str],
    options: CaptureOptions,
    trace_files: list[str],
    steps_seen: int,
    status: Status,
    errors: list[str],
    exit_code: int | None,
) -> Manifest:
    """The manifest of this process, ending now (versions, host, cwd and pid filled in here)."""
    torch_module = sys.modules.get("torch")
    return Manifest(
        schema_version=SCHEMA_VERSION,
        torchscope_version=__version__,
        torch_version=str(getattr(torch_module, "__version__", "unknown")),
        python_version=platform.python_version(),
        command=command,
        cwd=os.getcwd(),
        host=socket.gethostname(),
        pid=os.getpid(),
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        start_time=start_time,
        end_time=utc_now_iso(),
        schedule=schedule,
        activities=activities,
        options=options,
        trace_files=trace_files,
        steps_seen=steps_seen,
        environment=capture_environment(),
        status=status,
        errors=errors,
        exit_code=exit_code,
    )


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` atomically; raises OSError when the directory is unusable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, sort_keys=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
