"""Where the tests find real Kineto traces.

The full traces live in ../shared/traces beside the repository (with a cpu/ or gpu/ level), or wherever
TORCHSCOPE_SHARED_TRACES points (pointing it at a missing folder shows what a fresh clone runs). Without
them, tests run on the tiny real traces committed under tests/data/traces (same folder names, no cpu/ or
gpu/ level): whole copies of the small traces, and steps 5-8 of one file each of the two ResNet-50
folders; hta_nccl_rank0 is not there. Figures known only for the full traces stay on the full traces
(the `shared_traces` fixture, which skips without them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_ENV = "TORCHSCOPE_SHARED_TRACES"
COMMITTED_TRACES = REPO / "tests" / "data" / "traces"


def shared_root() -> Path:
    """The folder of the full traces: $TORCHSCOPE_SHARED_TRACES, else ../shared/traces (may be absent)."""
    value = os.environ.get(SHARED_ENV, "")
    return Path(value).expanduser() if value else REPO.parent / "shared" / "traces"


def shared_missing_reason() -> str | None:
    root = shared_root()
    if root.is_dir():
        return None
    return f"needs the full real traces, not found at {root} (../shared/traces beside the repo, or ${SHARED_ENV})"


@dataclass(frozen=True)
class TraceSet:
    """A folder of real traces: the full ones (`full`) or the committed cuts."""

    root: Path
    full: bool

    def has(self, name: str) -> bool:
        return self._find(name) is not None

    def folder(self, name: str) -> Path:
        """The trace folder `name` (e.g. "resnet50_num_workers_0"), under a cpu/ or gpu/ level or not."""
        found = self._find(name)
        if found is None:
            raise FileNotFoundError(f"no trace folder {name!r} in {self.root}")
        return found

    def file(self, *names: str) -> Path:
        """The first trace file (sorted by name) of the first of the folders `names` this set holds."""
        return trace_files(self.pick(*names))[0]

    def pick(self, *names: str) -> Path:
        """The first of the folders `names` this set holds (the full traces have some the cuts lack)."""
        for name in names:
            if self.has(name):
                return self.folder(name)
        raise FileNotFoundError(f"none of {names} in {self.root}")

    def files(self) -> list[Path]:
        """Every trace file of the set, sorted."""
        return trace_files(self.root)

    def _find(self, name: str) -> Path | None:
        for candidate in (self.root / name, self.root / "gpu" / name, self.root / "cpu" / name):
            if candidate.is_dir():
                return candidate
        return None


def trace_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))


def trace_set() -> TraceSet:
    """The full traces when present, else the committed cuts (always there)."""
    shared = shared_root()
    return TraceSet(shared, True) if shared.is_dir() else TraceSet(COMMITTED_TRACES, False)
