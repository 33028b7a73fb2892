"""Read the run manifest(s) written at capture time (`run.json`, `run.rank<N>.json`), tolerantly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


def read_manifests(path: Path) -> list[dict[str, Any]]:
    """Manifests found in the run directory `path` (empty for a bare trace or foreign folder)."""
    directory = path if path.is_dir() else path.parent
    found: list[dict[str, Any]] = []
    for candidate in sorted(directory.glob("run*.json")):
        if candidate.name != "run.json" and not candidate.name.startswith("run.rank"):
            continue
        try:
            data = msgspec.json.decode(candidate.read_bytes())
        except (OSError, msgspec.DecodeError, RecursionError):
            continue  # a damaged manifest only loses context, never the analysis
        if isinstance(data, dict):
            found.append(data)
    return found
