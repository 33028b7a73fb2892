"""The terminal report at 100 columns, exactly, for every planted-bottleneck example and a real GPU cut.

The reports under tests/data/reports/examples/ were analysed from captures of examples/bottlenecks/
(`torchscope run`, CPU, 2 cores) and of tests/data/traces/resnet50_num_workers_0; the expected text sits
beside each. After a deliberate change to the renderer or the findings, rewrite them with

    .venv/bin/python tests/unit/test_terminal_examples.py [capture-folder ...]

(with capture folders: re-analyse those runs first, named after their folder) and read the diff.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "tests" / "data" / "reports" / "examples"
WIDTH = 100

sys.path.insert(0, str(REPO))
from torchscope.diagnose.engine import diagnose  # noqa: E402
from torchscope.render.terminal import render_terminal  # noqa: E402
from torchscope.report.model import Report, decode_report, encode_report  # noqa: E402


def _report(name: str) -> Report:
    report = decode_report(gzip.decompress((EXAMPLES / f"{name}.json.gz").read_bytes()))
    report.findings = diagnose(report)  # today's rules on the stored measurements
    return report


def _names() -> list[str]:
    return sorted(p.name.removesuffix(".json.gz") for p in EXAMPLES.glob("*.json.gz"))


@pytest.mark.parametrize("name", _names())
def test_terminal_output_at_100_columns(name: str) -> None:
    expected = (EXAMPLES / f"{name}.txt").read_text()
    assert render_terminal(_report(name), width=WIDTH) == expected


def test_every_example_has_a_report() -> None:
    scripts = {p.stem for p in (REPO / "examples" / "bottlenecks").glob("*.py")}
    assert scripts <= set(_names())


def _store(name: str, report: Report) -> None:
    report.run.paths = [name]
    report.run.trace_files = [Path(p).name for p in report.run.trace_files]
    for rank in report.ranks:
        rank.files = [Path(p).name for p in rank.files]
    report.run.manifest = {k: v for k, v in report.run.manifest.items() if k not in ("cwd", "host", "pid", "start_time", "end_time")}
    (EXAMPLES / f"{name}.json.gz").write_bytes(gzip.compress(encode_report(report), mtime=0))


def rewrite(captures: list[Path]) -> None:
    """Re-analyse `captures` (named after their folder), then rewrite every expected text."""
    import torchscope

    EXAMPLES.mkdir(parents=True, exist_ok=True)
    for folder in captures:
        _store(folder.name, torchscope.analyze(folder, jobs=1, use_cache=False))
    for name in _names():
        (EXAMPLES / f"{name}.txt").write_text(render_terminal(_report(name), width=WIDTH))


if __name__ == "__main__":
    rewrite([Path(p) for p in sys.argv[1:]])
