"""Transitional: the run manifests as plain dicts, for callers not yet reading
:func:`torchscope.rundir.manifest.read_manifests` (one :class:`~torchscope.rundir.manifest.Manifest` struct
each). Delete once ``pipeline/manifests.py`` reads them from there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from torchscope.rundir import manifest


def read_manifests(path: Path) -> list[dict[str, Any]]:
    """The manifests of the run directory ``path`` as JSON objects: their recorded, well-typed fields only
    (tolerant reading as in :func:`torchscope.rundir.manifest.read_manifests`; never raises)."""
    return [msgspec.to_builtins(m) for m in manifest.read_manifests(path)]
