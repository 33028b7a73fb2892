"""The run's manifest summary for the Report, from the manifests found beside the traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchscope.rundir.manifest import manifest_summary, read_manifests


def run_manifest(paths: list[Path]) -> tuple[dict[str, Any], list[str | None]]:
    """(summary for `report.run.manifest`, each manifest's status: None where it recorded none)."""
    manifests = [m for p in paths for m in read_manifests(p)]
    statuses: list[str | None] = [m.status if isinstance(m.status, str) else None for m in manifests]
    return manifest_summary(manifests), statuses
