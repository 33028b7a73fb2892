"""`torchscope diff` / `check` on synthetic CPU traces whose step times are known: the noise model,
the verdicts, the JSON shape, the gate's exit codes and its thresholds, and saved version-1 reports."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope import cli
from torchscope.pipeline.diff import diff_paths, load_report
from torchscope.pipeline.noise import relative_change_interval, student_t_quantile

STEPS = 8


def _trace(path: Path, step_us: float, noise: float = 0.01, data_share: float = 0.1, steps: int = STEPS, seed: int = 0) -> Path:
    """A CPU trace of `steps` steps of about `step_us` (relative noise `noise`), each opening with a
    DataLoader fetch of `data_share` of the step, then forward ops."""
    rng = random.Random(seed)
    b = TraceBuilder()
    t = 0.0
    for i in range(steps):
        dur = step_us * (1 + rng.uniform(-noise, noise))
        b.step(i + 2, t, dur)
        b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t + 1, data_share * dur)
        b.op("aten::mm", t + 2 + data_share * dur, (0.85 - data_share) * dur, **{"Input Dims": [[64, 64], [64, 64]]})
        t += dur + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    return b.write(path)


def test_student_t_quantiles_match_the_tables() -> None:
    for df, expected in [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)]:
        assert student_t_quantile(0.975, df) == pytest.approx(expected, rel=2e-3)


def test_the_interval_holds_the_true_change_and_says_when_steps_are_too_few() -> None:
    base = [100.0, 102.0, 98.0, 101.0, 99.0]
    slower = [x * 1.2 for x in base]
    interval = relative_change_interval(base, slower)
    assert interval.change_pct == pytest.approx(20.0)
    assert interval.low_pct is not None and interval.high_pct is not None
    assert interval.low_pct < 20.0 < interval.high_pct and interval.significant
    same = relative_change_interval(base, list(reversed(base)))
    assert not same.significant and same.change_pct == pytest.approx(0.0)
    few = relative_change_interval([100.0, 101.0], [150.0, 151.0])
    assert not few.significant and few.low_pct is None and "too few steps" in few.method


def test_the_interval_never_reaches_below_minus_100_percent() -> None:
    # A much faster, very spread run: the symmetric interval would extend below -100 %, a negative time.
    interval = relative_change_interval([100.0, 101.0, 99.0, 100.0], [1.0, 60.0, 2.0, 1.0])
    assert interval.low_pct == -100.0 and interval.high_pct is not None and interval.high_pct > interval.change_pct
    assert interval.change_pct == pytest.approx(-84.0)


def test_a_slower_run_is_slower_beyond_noise_and_an_equal_one_is_not(tmp_path: Path) -> None:
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000, seed=1)
    same = _trace(tmp_path / "b" / "t.pt.trace.json", 10_000, seed=2)
    slower = _trace(tmp_path / "c" / "t.pt.trace.json", 12_000, seed=3)
    equal = diff_paths(base, same, jobs=1, use_cache=False)
    assert equal.step_time.verdict == "no significant change" and not equal.step_time.significant
    diff = diff_paths(base, slower, jobs=1, use_cache=False)
    s = diff.step_time
    assert s.verdict == "slower" and s.significant
    assert s.change_pct == pytest.approx(20.0, abs=1.5)
    assert s.ci_low_pct is not None and s.ci_high_pct is not None and s.ci_low_pct < s.change_pct < s.ci_high_pct
    assert s.base_steps == s.new_steps == STEPS
    mean = next(m for m in diff.metrics if m.name == "step_time.mean_us")
    assert mean.verdict == "worse" and mean.significant
    throughput = next(m for m in diff.metrics if m.name == "throughput.steps_per_s")
    assert throughput.verdict == "worse" and throughput.change_pct == pytest.approx(100 / 1.2 - 100, abs=1.5)
    assert {f.category for f in diff.breakdown} >= {"data_loading", "forward"}


def test_json_output_has_the_documented_step_time_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000, seed=1)
    new = _trace(tmp_path / "b" / "t.pt.trace.json", 7_500, seed=2)  # 25 % faster: beyond the 4 % run-to-run floor
    assert cli.main(["diff", str(base), str(new), "--format", "json", "--no-cache", "--jobs", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    step = doc["step_time"]
    assert {"base_us", "new_us", "change_pct", "ci_low_pct", "ci_high_pct", "significant", "verdict"} <= set(step)
    assert step["verdict"] == "faster" and step["significant"] is True
    for metric in doc["metrics"]:
        assert {"name", "unit", "better", "base", "new", "change_pct", "ci_low_pct", "ci_high_pct", "significant", "verdict"} <= set(metric)


def test_the_gate_fails_on_a_regression_beyond_noise_and_threshold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000, seed=1)
    slower = _trace(tmp_path / "b" / "t.pt.trace.json", 12_000, seed=2)
    slightly = _trace(tmp_path / "c" / "t.pt.trace.json", 10_300, seed=3)
    args = ["--no-cache", "--jobs", "1"]
    assert cli.main(["diff", str(base), str(slower), "--fail-if-slower", "5%", *args]) == 1
    out = capsys.readouterr().out
    assert "FAIL: Regression: step time +20" in out and "limit +5 %" in out
    # 3 % slower is beyond noise here (1 % step noise) but within the 5 % threshold.
    assert cli.main(["diff", str(base), str(slightly), "--fail-if-slower", "5%", *args]) == 0
    assert "PASS" in capsys.readouterr().out
    assert cli.main(["check", str(slower), "--baseline", str(base), *args]) == 1  # 5 % by default


def test_a_share_threshold_in_percentage_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000, data_share=0.10, seed=1)
    more_data = _trace(tmp_path / "b" / "t.pt.trace.json", 10_000, data_share=0.20, seed=2)
    args = ["--no-cache", "--jobs", "1"]
    assert cli.main(["diff", str(base), str(more_data), "--fail-on", "data_loading+5pp", *args]) == 1
    assert "data_loading share 10.0 -> 20.0 %" in capsys.readouterr().out.replace("\n", " ")
    assert cli.main(["diff", str(base), str(more_data), "--fail-on", "data_loading+15pp", *args]) == 0
    capsys.readouterr()


def test_bad_thresholds_and_inputs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000)
    for bad in (["--fail-if-slower", "fast"], ["--fail-on", "data_loading"], ["--fail-on", "nonsense+3pp"]):
        assert cli.main(["diff", str(base), str(base), "--no-cache", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("torchscope: error: ") and err.count("\n") == 1
    assert cli.main(["diff", str(base), str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_fifo_or_device_given_as_a_report_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Reading a FIFO named like a saved report would wait for a writer forever.
    base = _trace(tmp_path / "a" / "t.pt.trace.json", 10_000)
    fifo = tmp_path / "baseline.json"
    os.mkfifo(fifo)
    for bad in (fifo, Path("/dev/zero")):
        assert cli.main(["diff", str(bad), str(base), "--no-cache"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("torchscope: error: ") and err.count("\n") == 1


def test_a_saved_version_1_report_is_a_valid_baseline(tmp_path: Path) -> None:
    # A report written by version 1 (`signals`, no `measurements` or `metrics`): the golden of
    # resnet50_num_workers_0 before it was rewritten, its header (schema_version, torchscope_version)
    # restored, as test_pipeline does.
    stored = Path(__file__).resolve().parents[1] / "data" / "reports" / "v1_resnet50_num_workers_0.json.gz"
    v1 = json.loads(gzip.decompress(stored.read_bytes()))
    assert "signals" in v1 and "measurements" not in v1 and "metrics" not in v1
    v1.update(schema_version=1, torchscope_version="0.1.0")
    saved = tmp_path / "baseline.json"
    saved.write_text(json.dumps(v1))
    upgraded = load_report(saved)
    assert upgraded.schema_version == 2
    assert upgraded.measurements.sync.syncs_per_step == v1["signals"]["sync"]["syncs_per_step"]
    cut = Path(__file__).resolve().parents[1] / "data" / "traces" / "resnet50_num_workers_4"
    diff = diff_paths(saved, cut, jobs=1, use_cache=False)
    assert diff.base.schema_version == 2 and diff.base.torchscope_version == "0.1.0" and diff.base.steps == len(v1["steps"])
    assert diff.step_time.base_us == pytest.approx(sum(s["duration_us"] for s in v1["steps"]) / len(v1["steps"]))
    data = {c.category: c for c in diff.breakdown}["data_loading"]
    assert data.base_percent == pytest.approx(v1["breakdown"]["data_loading"]["percent"])
    assert data.change_pp < -25  # num_workers=4 hides the loading that num_workers=0 exposed
    assert any(f.id == "data_loading.exposed" and f.new_share is not None and f.base_share is not None
               and f.new_share < f.base_share for f in diff.findings)
    # Both sides recorded shapes: operators match by (name, shapes), and rows of the old report are found.
    matched = [r for r in diff.operators if r.status == "changed"]
    assert matched and all(r.input_shapes is not None for r in matched)


def test_the_html_diff_is_one_static_page_with_user_text_escaped(tmp_path: Path) -> None:
    hostile = "</script><img src=x onerror=alert(1)>"
    b = TraceBuilder()
    for i in range(4):
        b.step(i + 2, i * 10_000.0, 9_000)
        b.op(hostile, i * 10_000.0 + 10, 5_000)
    base = b.write(tmp_path / "a" / "t.pt.trace.json")
    new = _trace(tmp_path / "b" / "t.pt.trace.json", 10_000)
    out = tmp_path / "diff.html"
    assert cli.main(["diff", str(base), str(new), "--format", "html", "-o", str(out), "--no-cache", "--jobs", "1"]) == 0
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page.split("</style>")[1]
    assert hostile not in page and "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "Step time" in page and "removed" in page
