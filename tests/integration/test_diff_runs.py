"""`diff` and the regression gate on real CPU training runs (examples/ci/train_step_time.py): a real
fix shows as faster beyond noise, identical runs do not trip the gate, a planted 20 % regression does,
a planted memory regression trips a peak-memory threshold, operators match by call site across runs
with and without stacks, a saved version-1 report is a usable baseline, and the CI example of docs/ci.md
runs as written."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from torchscope import cli
from torchscope.pipeline.diff import diff_paths, load_report
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
    # With call stacks and allocations recorded; the second holds 16 MB more through every step.
    memory = ["--steps", str(STEPS), "--with-stack", "--profile-memory"]  # the same window as same0
    example.main(["--out", str(root / "stacks"), *memory])
    example.main(["--out", str(root / "more_memory"), *memory, "--extra-mb", "16"])
    out["stacks"], out["more_memory"] = root / "stacks", root / "more_memory"
    return out


def test_more_dataloader_workers_are_faster_beyond_noise(runs: dict[str, Path]) -> None:
    diff = diff_paths(runs["same0"], runs["workers"], jobs=1)
    assert diff.step_time.verdict == "faster" and diff.step_time.significant
    data = {c.category: c for c in diff.breakdown}["data_loading"]
    # Share and time both drop: by about half on a quiet machine; at load average 8-9 on 2 cores the two
    # workers were starved to a 46 % drop (21.3 -> 11.5 ms), hence the margin.
    assert data.change_pp < -5 and data.new_us < 0.75 * data.base_us, data


def test_identical_runs_rarely_trip_the_gate(runs: dict[str, Path]) -> None:
    """The false-alarm rate of the gate at its defaults (5 % and beyond noise): docs/ci.md records it.
    It holds on a machine that is not oversubscribed; on one that is (docs/ci.md measured 10.7 % at load
    average 11-13 on 2 cores), each alarm must at least say that its runs were captured on a busy machine."""
    names = [f"same{i}" for i in range(REPEATS)]
    gates = {(a, b): evaluate(diff_paths(runs[a], runs[b], jobs=1), DEFAULT_SLOWER_PCT, []) for a, b in itertools.permutations(names, 2)}
    alarms = [pair for pair, gate in gates.items() if gate.failed]
    unexplained = [pair for pair in alarms if "captured on a busy machine" not in gates[pair].explanation]
    assert len(unexplained) <= 1, f"{len(alarms)} false alarms in {len(gates)} ordered pairs, {len(unexplained)} not flagged busy: {unexplained}"


def test_a_planted_20_percent_regression_trips_the_gate(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diff", str(runs["same0"]), str(runs["slower"]), "--fail-if-slower", "5%", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: Regression: step time +" in out
    change = float(re.search(r"step time \+(\d+\.\d)", out).group(1))  # type: ignore[union-attr]
    assert 10 < change < 50  # measured 38-40 % at load average 7-9 on 2 cores (the baseline run ran faster)


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


PEAK = "memory.peak_allocated_bytes.cpu"


def test_a_planted_memory_regression_trips_a_peak_memory_threshold(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base, more = str(runs["stacks"]), str(runs["more_memory"])
    assert cli.main(["diff", base, more, "--fail-on", f"{PEAK}+10%", "--jobs", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"FAIL: Regression: {PEAK} +" in out and "(worse, beyond noise), limit 10 % worse" in out
    # The other way round the peak falls: never a regression.
    assert cli.main(["diff", more, base, "--fail-on", f"{PEAK}+10%", "--jobs", "1"]) == 0
    assert "PASS" in capsys.readouterr().out
    peak = next(m for m in diff_paths(base, more, jobs=1).metrics if m.name == PEAK)
    assert peak.base is not None and peak.new is not None and peak.new - peak.base >= 15 * (1 << 20)


def test_real_runs_match_operators_by_call_site_and_without_stacks_by_shape(runs: dict[str, Path]) -> None:
    diff = diff_paths(runs["stacks"], runs["more_memory"], jobs=1)
    sited = [r for r in diff.operators if r.call_site]
    assert sited, "with_stack runs should give call sites (report.call_sites)"
    # The model's operators come from main() on both sides: matched there, not added or removed.
    model = [r for r in sited if r.name in ("aten::addmm", "aten::mm") and r.call_site.startswith("main (")]
    assert model and all(r.status == "changed" for r in model)
    # The ballast is allocated in main(): an allocation from a new call site, listed as added (the
    # baseline's list of aten::empty sites is complete, so it is not hidden in an unlisted rest).
    assert any(r.name == "aten::empty" and r.call_site and r.call_site.startswith("main (") and r.status == "added" for r in sited)
    # One side without stacks: matched by (name, input shapes), nothing added or removed for it.
    for base, new in ((runs["stacks"], runs["same0"]), (runs["same0"], runs["stacks"])):
        rows = diff_paths(base, new, jobs=1).operators
        assert rows and {r.status for r in rows} == {"changed"} and all(r.call_site is None for r in rows)
        assert any(r.input_shapes for r in rows)


def test_a_torch_cpu_run_diffs_against_a_saved_version_1_report(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stored version-1 report (a GPU ResNet-50 run: `signals`, no `measurements` or `metrics`;
    its header restored as test_pipeline does) against a torch 2.13 CPU run, both ways, and as check's baseline."""
    v1 = json.loads(gzip.decompress((REPO / "tests" / "data" / "reports" / "v1_resnet50_num_workers_0.json.gz").read_bytes()))
    v1.update(schema_version=1, torchscope_version="0.1.0")
    saved = tmp_path / "baseline.json"
    saved.write_text(json.dumps(v1))
    assert load_report(saved).measurements.sync.syncs_per_step == v1["signals"]["sync"]["syncs_per_step"]
    diff = diff_paths(saved, runs["same0"], jobs=1)
    assert diff.base.torchscope_version == "0.1.0" and diff.new.device_kind == "cpu" and diff.new.steps == STEPS
    assert any("different devices" in w for w in diff.warnings)
    assert diff.step_time.base_us == pytest.approx(sum(s["duration_us"] for s in v1["steps"]) / len(v1["steps"]))
    assert diff.step_time.verdict == "faster"  # a 150 ms GPU ResNet-50 step against a ~20 ms toy CPU step
    data = {c.category: c for c in diff.breakdown}["data_loading"]
    assert data.base_percent == pytest.approx(v1["breakdown"]["data_loading"]["percent"]) and data.new_percent > 0
    # The v1 report has no metrics: each of the new run's is listed, not comparable, never a failure.
    assert diff.metrics and all(m.verdict == "not comparable" for m in diff.metrics)
    assert diff.operators and diff.kernels and all(r.status == "removed" for r in diff.kernels)  # no GPU on the CPU run
    assert cli.main(["diff", str(runs["same0"]), str(saved), "--format", "json", "--jobs", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time"]["verdict"] == "slower"
    assert cli.main(["check", str(runs["same0"]), "--baseline", str(saved), "--jobs", "1"]) == 0
    assert "PASS" in capsys.readouterr().out
