"""The run manifest (``run.json`` / ``run.rank<R>.json``): what a later analysis needs to know about a capture.

One struct for the writer (the capture, once, at its end) and every reader; the fields are documented in
docs/run-directory.md. A field that a manifest does not hold is ``UNSET``, not a default: a manifest is the
record of a past run, and one written by an earlier version lacks the newer fields (``environment``), so a
reader has to tell "not recorded" from "recorded as 0". The report shows the recorded fields only.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from torchscope import __version__
from torchscope.files import read_regular, write_atomic
from torchscope.rundir.config import SCHEDULE_FIELDS, CaptureConfig
from torchscope.rundir.layout import is_manifest_name

SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KB: anything this large is not one

Status = Literal["complete", "interrupted", "error", "stopped"]
# How the capture marked steps: `prof.step()` / `torchscope.step()` calls in code, or found by `torchscope run`
# (optimizer steps, DataLoader fetches, a forward after a backward, repeated calls of the first module).
StepMarking = Literal["manual", "optimizer", "dataloader", "backward", "module", "none"]
# Where an analysis found its steps (report.run.step_source): ProfilerStep#N ranges, or the whole trace.
StepSource = Literal["profiler_step", "whole_trace"]


class Schedule(msgspec.Struct, kw_only=True):
    """The ``torch.profiler.schedule`` of the capture (:data:`~torchscope.rundir.config.SCHEDULE_FIELDS`)."""

    skip_first: int | UnsetType = UNSET
    wait: int | UnsetType = UNSET
    warmup: int | UnsetType = UNSET
    active: int | UnsetType = UNSET
    repeat: int | UnsetType = UNSET


class CaptureOptions(msgspec.Struct, kw_only=True):
    """What ``torch.profiler`` recorded, and how the steps were marked."""

    record_shapes: bool | UnsetType = UNSET
    profile_memory: bool | UnsetType = UNSET
    with_stack: bool | UnsetType = UNSET
    with_flops: bool | UnsetType = UNSET
    phase_labels: bool | UnsetType = UNSET  # whether the labels were recorded (their hooks installed)
    step_marking: StepMarking | UnsetType = UNSET


class Manifest(msgspec.Struct, kw_only=True):
    """One process's manifest; fields in the order they are written."""

    schema_version: int | UnsetType = UNSET
    torchscope_version: str | UnsetType = UNSET
    torch_version: str | UnsetType = UNSET
    python_version: str | UnsetType = UNSET
    command: list[str] | str | UnsetType = UNSET  # argv; one string is accepted from hand-written manifests
    cwd: str | UnsetType = UNSET
    host: str | UnsetType = UNSET
    pid: int | UnsetType = UNSET
    rank: int | UnsetType = UNSET
    world_size: int | UnsetType = UNSET
    local_rank: int | UnsetType = UNSET
    backend: str | UnsetType = UNSET  # torch.distributed's backend (gloo, nccl, ...) while tracing
    start_time: str | UnsetType = UNSET  # ISO-8601 UTC
    end_time: str | UnsetType = UNSET
    schedule: Schedule | UnsetType = UNSET
    activities: list[str] | UnsetType = UNSET
    options: CaptureOptions | UnsetType = UNSET
    trace_files: list[str] | UnsetType = UNSET  # relative to the run directory
    steps_seen: int | UnsetType = UNSET
    environment: dict[str, Any] | UnsetType = UNSET  # what rules need to size their advice (CPUs, threads)
    status: Status | UnsetType = UNSET
    errors: list[str] | UnsetType = UNSET
    exit_code: int | None | UnsetType = UNSET  # the script's exit code under `torchscope run`; None in-code


# -- writing ------------------------------------------------------------------------------------------------


def utc_now_iso(timestamp: float | None = None) -> str:
    """ISO-8601 UTC with milliseconds, e.g. ``2026-11-30T03:15:00.123Z``."""
    now = time.time() if timestamp is None else timestamp
    millis = int(round((now % 1) * 1000)) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{millis:03d}Z"


def build_manifest(
    *,
    config: CaptureConfig,
    step_marking: StepMarking,
    phase_labels: bool,
    command: list[str],
    rank: int,
    world_size: int,
    local_rank: int,
    start_time: str,
    activities: list[str],
    trace_files: list[str],
    steps_seen: int,
    status: Status,
    errors: list[str],
    exit_code: int | None,
    torch_version: str,
    environment: dict[str, Any],
    backend: str | None = None,
) -> Manifest:
    """The manifest of this process, ending now (Python version, host, cwd and pid filled in here).

    The schedule and options are ``config``'s, except what only the capture knows: whether the phase
    labels were recorded (``phase_labels``) and how steps were marked (``step_marking``)."""
    schedule = Schedule(**{name: getattr(config, name) for name in SCHEDULE_FIELDS})
    options = CaptureOptions(
        record_shapes=config.record_shapes,
        profile_memory=config.profile_memory,
        with_stack=config.with_stack,
        with_flops=config.with_flops,
        phase_labels=phase_labels,
        step_marking=step_marking,
    )
    return Manifest(
        schema_version=SCHEMA_VERSION,
        torchscope_version=__version__,
        torch_version=torch_version,
        python_version=platform.python_version(),
        command=command,
        cwd=os.getcwd(),
        host=_host_name(),
        pid=os.getpid(),
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=backend if backend else UNSET,
        start_time=start_time,
        end_time=utc_now_iso(),
        schedule=schedule,
        activities=activities,
        options=options,
        trace_files=trace_files,
        steps_seen=steps_seen,
        environment=environment,
        status=status,
        errors=errors,
        exit_code=exit_code,
    )


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` as indented JSON, atomically and synced to disk (it is written last,
    and must survive a crash right after the capture); raises OSError when the directory is unusable."""
    write_atomic(path, msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n", fsync=True)


# -- reading ------------------------------------------------------------------------------------------------


def read_manifests(path: Path) -> list[Manifest]:
    """The manifests of the run directory ``path`` (or of the folder of the trace file ``path``), in file
    name order; empty for a bare trace or a foreign folder.

    A manifest only adds context, so a damaged one never stops an analysis: this never raises. An unreadable,
    oversized or non-object manifest is skipped, and a known field of the wrong type is dropped (as if
    absent), so that readers downstream can trust the declared types."""
    try:
        directory = path if path.is_dir() else path.parent
        names = sorted(entry.name for entry in directory.iterdir() if is_manifest_name(entry.name))
    except OSError:
        return []
    manifests = (_read_manifest(directory / name) for name in names)
    return [manifest for manifest in manifests if manifest is not None]


def _read_manifest(path: Path) -> Manifest | None:
    try:  # a regular file only (a FIFO named run.json would block for ever), of a bounded size
        data = msgspec.json.decode(read_regular(path, MAX_MANIFEST_BYTES))
    except (OSError, msgspec.DecodeError, RecursionError):
        return None
    return _manifest_from_json(data) if isinstance(data, dict) else None


def _manifest_from_json(data: dict[str, Any]) -> Manifest | None:
    """A decoded JSON object as a :class:`Manifest`: known fields of the wrong type are dropped (nested ones
    inside ``schedule`` and ``options`` one by one), an older ``options.step_source`` becomes
    ``options.step_marking``. None only if it still does not convert (it always should)."""
    data = dict(data)
    if isinstance(data.get("schedule"), dict):
        data["schedule"] = _well_typed(data["schedule"], Schedule)
    if isinstance(data.get("options"), dict):
        data["options"] = _well_typed(_renamed_options(data["options"]), CaptureOptions)
    try:
        return msgspec.convert(_well_typed(data, Manifest), Manifest)
    except (msgspec.ValidationError, RecursionError):  # each field converted on its own already
        return None


def _renamed_options(options: dict[str, Any]) -> dict[str, Any]:
    # Manifests written before the report's `step_source` and the capture's own were told apart say
    # `step_source` for what is now `step_marking` (same values).
    if "step_source" in options and "step_marking" not in options:
        return {("step_marking" if key == "step_source" else key): value for key, value in options.items()}
    return options


def _well_typed(data: dict[str, Any], struct: type[msgspec.Struct]) -> dict[str, Any]:
    """``data`` without the known fields whose value does not convert to ``struct``'s declared type
    (unknown fields pass: the struct ignores them)."""
    return {key: value for key, value in data.items() if _converts({key: value}, struct)}


def _converts(data: dict[str, Any], struct: type[msgspec.Struct]) -> bool:
    try:
        msgspec.convert(data, struct)
    except (msgspec.ValidationError, RecursionError):
        return False
    return True


# -- the report's view --------------------------------------------------------------------------------------

# The fields a report carries (report.run.manifest), taken from the first manifest.
SUMMARY_FIELDS = (
    "torchscope_version", "torch_version", "command", "host", "world_size", "backend", "schedule", "activities", "options",
    "status", "start_time", "steps_seen", "errors", "environment",
)


def manifest_summary(manifests: list[Manifest]) -> dict[str, Any]:
    """What a report says about the capture: the first manifest's :data:`SUMMARY_FIELDS` that it recorded,
    ``status`` over all of them (one status, or the sorted distinct ones when ranks ended differently), and
    the number of ``manifests``. Empty without manifests."""
    if not manifests:
        return {}
    first = msgspec.to_builtins(manifests[0])  # UNSET fields are left out
    summary = {name: first[name] for name in SUMMARY_FIELDS if name in first}
    statuses = sorted({m.status for m in manifests if not isinstance(m.status, UnsetType)})
    if statuses:
        summary["status"] = statuses[0] if len(statuses) == 1 else statuses
    summary["manifests"] = len(manifests)
    hosts = sorted({m.host for m in manifests if isinstance(m.host, str)})
    if len(manifests) > 1 and hosts:  # across ranks: every host, and each rank's local rank on its host
        summary["hosts"] = hosts
        summary["local_ranks"] = {str(m.rank): m.local_rank for m in manifests if isinstance(m.rank, int) and isinstance(m.local_rank, int)}
    return summary


def _host_name() -> str:
    import socket  # on use: only capture writes manifests (6 ms of imports for every analysis otherwise)

    return socket.gethostname()
