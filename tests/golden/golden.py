"""Golden reports: the JSON report of every real trace (each file and each folder) as it was before a
redesign, so a refactor can show that it changed no figure. `python tests/golden/golden.py` rewrites them
(only do that when a report is meant to change, and say why in the commit)."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests"))  # when run as a script
from helpers.real_traces import COMMITTED_TRACES, shared_root  # noqa: E402

SOURCES = {"shared": shared_root(), "data": COMMITTED_TRACES}

# Never compared: they change with every release.
VERSION_FIELDS = ("schema_version", "torchscope_version")


def inputs(source: str) -> Iterator[tuple[str, Path]]:
    """(name, path) of every trace file and every trace folder under a source."""
    root = SOURCES[source]
    files = sorted(
        p for p in root.rglob("*.json*")
        if p.is_file() and p.name.endswith((".json", ".json.gz"))
        and not any(part.startswith(".") for part in p.relative_to(root).parts)  # caches other tests wrote
    )
    for folder in sorted({p.parent for p in files}):
        yield str(folder.relative_to(root)) + "/", folder
    for path in files:
        yield str(path.relative_to(root)), path


def golden_path(source: str, name: str) -> Path:
    return GOLDEN / source / (name.strip("/").replace("/", "__") + (".dir" if name.endswith("/") else "") + ".json.gz")


def normalised(report: dict[str, Any], root: Path) -> dict[str, Any]:
    """The report without its version fields and with paths relative to the traces' root."""
    out = {k: v for k, v in report.items() if k not in VERSION_FIELDS}
    run = dict(out["run"])
    # trace_files are relative to the folder analysed (or the file's name when a file was): back to full paths.
    given = Path(run["paths"][0]) if run["paths"] else root
    run["trace_files"] = [_relative(str(given / p if given.is_dir() else given), root) for p in run["trace_files"]]
    run["paths"] = [_relative(p, root) for p in run["paths"]]
    out["run"] = run
    out["ranks"] = [{**r, "files": [_relative(p, root) for p in r["files"]]} for r in out.get("ranks", [])]
    return out


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def differences(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Paths where two JSON values differ (floats within a relative 1e-9: summation order may change);
    fields present only in `actual` are new, not differences."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        # Keys the golden file lacks are fields added since it was recorded: not compared. A renamed or
        # dropped field still shows, as missing.
        out = [f"{where}.{k}: missing" for k in expected if k not in actual]
        for key in expected.keys() & actual.keys():
            out += differences(expected[key], actual[key], f"{where}.{key}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{where}: length {len(expected)} != {len(actual)}"]
        return [d for i, (a, b) in enumerate(zip(expected, actual)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(expected, float) or isinstance(actual, float):
        if isinstance(expected, (int, float)) and isinstance(actual, (int, float)) and not isinstance(expected, bool):
            if math.isclose(expected, actual, rel_tol=1e-9, abs_tol=1e-9):
                return []
    if expected != actual:
        return [f"{where}: {expected!r} != {actual!r}"[:300]]
    return []


def report_json(path: Path) -> dict[str, Any]:
    import msgspec

    import torchscope

    report = torchscope.analyze(path, jobs=1, use_cache=False)
    return json.loads(msgspec.json.encode(report))


def write_all() -> None:
    for source, root in SOURCES.items():
        if not root.is_dir():
            print(f"skipping {source}: {root} not found", file=sys.stderr)
            continue
        for name, path in inputs(source):
            target = golden_path(source, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(normalised(report_json(path), root), indent=1, sort_keys=True)
            target.write_bytes(gzip.compress(text.encode(), mtime=0))
            print(f"{target.relative_to(REPO)}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    write_all()
