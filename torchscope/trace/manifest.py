"""Read the run manifest(s) written at capture time (`run.json`, `run.rank<N>.json`), tolerantly.

A manifest only adds context, so a damaged one never stops an analysis: an unreadable, oversized or
non-object manifest is skipped, and a known field of the wrong type is dropped (as if absent), so that
readers downstream can trust the types in docs/run-directory.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

MAX_MANIFEST_BYTES = 16 << 20

# Known fields and their JSON types (docs/run-directory.md); unknown (newer) fields pass unchanged.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema_version": int,
    "torchscope_version": str,
    "torch_version": str,
    "python_version": str,
    "command": (list, str),
    "cwd": str,
    "host": str,
    "pid": int,
    "rank": int,
    "world_size": int,
    "local_rank": int,
    "local_world_size": int,
    "cpu_count": int,
    "start_time": str,
    "end_time": str,
    "schedule": dict,
    "activities": list,
    "options": dict,
    "trace_files": list,
    "steps_seen": int,
    "status": str,
    "errors": list,
    "exit_code": int,
    "environment": dict,
}
_STRING_LISTS = frozenset({"command", "activities", "trace_files"})


def read_manifests(path: Path) -> list[dict[str, Any]]:
    """Manifests found in the run directory `path` (empty for a bare trace or foreign folder)."""
    directory = path if path.is_dir() else path.parent
    found: list[dict[str, Any]] = []
    try:
        candidates = sorted(directory.glob("run*.json"))
    except OSError:
        return found
    for candidate in candidates:
        if candidate.name != "run.json" and not candidate.name.startswith("run.rank"):
            continue
        try:
            if candidate.stat().st_size > MAX_MANIFEST_BYTES:
                continue
            data = msgspec.json.decode(candidate.read_bytes())
        except (OSError, msgspec.DecodeError, RecursionError):
            continue  # a damaged manifest only loses context, never the analysis
        if isinstance(data, dict):
            found.append(well_typed(data))
    return found


def well_typed(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` without the known fields whose value has the wrong type."""
    return {key: value for key, value in manifest.items() if _has_declared_type(key, value)}


def _has_declared_type(key: str, value: Any) -> bool:
    expected = _FIELD_TYPES.get(key)
    if expected is None or value is None:
        return True
    if isinstance(value, bool) and expected is int:
        return False
    if not isinstance(value, expected):
        return False
    if key in _STRING_LISTS and isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return True
