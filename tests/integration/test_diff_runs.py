"""`diff` and the regression gate on real CPU training runs (examples/ci/train_step_time.py): a real
fix shows as faster beyond noise, identical runs do not trip the gate, a planted 20 % regression does,
and the CI example of docs/ci.md runs as written."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from torchscope import cli
from torchscope.pipeline.diff import diff_paths
from torchscope.pipeline.gate import DEFAULT_SLOWER_PCT, evaluate

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ci" / "train_step_time.py"
STEPS = 10
REPEATS = 5  # identical runs: 10 pairs for the false-alarm count


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_step_time", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real runs, made once: REPEATS identical baselines, the fix (2 workers) and a planted regression."""
    example = _example()
    root = tmp_path_factory.mktemp("diff-runs")
    out: dict[str, Path] = {}
    for i in range(REPEATS):
        example.main(["--out", str(root / f"same{i}"), "--steps", str(STEPS)])
        out[f"same{i}"] = root / f"same{i}"
    example.main(["--out", str(root / "workers"), "--steps", str(STEPS), "--num-workers", "2"])
    out["workers"] = root / "workers"
    base_ms = diff_paths(out["same0"], out["same0"], jobs=1).step_time.base_us / 1000
    example.main(["--out", str(root / "slower"), "--steps", str(STEPS), "--extra-ms", f"{0.2 * base_ms:.3f}"])
    out["slower"] = root / "slower"
    return out


def test_more_dataloader_workers_are_faster_beyond_noise(runs: dict[str, Path]) -> None:
    diff = diff_paths(runs["same0"], runs["workers"], jobs=1)
    assert diff.step_time.verdict == "faster" and diff.step_time.significant
    data = {c.category: c for c in diff.breakdown}["data_loading"]
    assert data.change_pp < -5 and data.new_us < 0.5 * data.base_us, data  # share and time both drop


def test_identical_runs_rarely_trip_the_gate(runs: dict[str, Path]) -> None:
    """The false-alarm rate of the gate at its defaults (5 % and beyond noise): docs/ci.md records it."""
    pairs = list(itertools.permutations([runs[f"same{i}"] for i in range(REPEATS)], 2))
    alarms = [(a.name, b.name) for a, b in pairs if evaluate(diff_paths(a, b, jobs=1), DEFAULT_SLOWER_PCT, []).failed]
    assert len(alarms) <= 1, f"{len(alarms)} false alarms in {len(pairs)} ordered pairs: {alarms}"


def test_a_planted_20_percent_regression_trips_the_gate(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diff", str(runs["same0"]), str(runs["slower"]), "--fail-if-slower", "5%", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: Regression: step time +" in out
    change = float(re.search(r"step time \+(\d+\.\d)", out).group(1))  # type: ignore[union-attr]
    assert 10 < change < 35


def test_the_ci_example_in_the_docs_runs_as_written(runs: dict[str, Path], tmp_path: Path) -> None:
    """The commands of docs/ci.md's tested block, with its variables pointing at real runs."""
    text = (REPO / "docs" / "ci.md").read_text()
    block = re.search(r"<!-- tested: begin -->\s*```bash\n(.*?)```\s*<!-- tested: end -->", text, re.S)
    assert block, "docs/ci.md lost its tested block"
    env = {**os.environ, "BASELINE_RUN": str(runs["same0"]), "NEW_RUN": str(runs["same1"]),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ok = subprocess.run(["bash", "-euo", "pipefail", "-c", block.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (tmp_path / "baseline.json").is_file() and "PASS" in ok.stdout
    env["NEW_RUN"] = str(runs["slower"])
    bad = subprocess.run(["bash", "-euo", "pipefail", "-c", block.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "FAIL: Regression" in bad.stdout
