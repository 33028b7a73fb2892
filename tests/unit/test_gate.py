"""The `--fail-on METRIC+X%` form of the regression gate on saved reports whose metrics are known: peak
memory and other metrics without per-step samples (a change counts from UNSAMPLED_TOLERANCE_PCT), in
their own direction, with the exit codes of `torchscope diff` and `check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchscope import cli
from torchscope.pipeline.diff import UNSAMPLED_TOLERANCE_PCT, diff_reports
from torchscope.pipeline.gate import evaluate, parse_threshold
from torchscope.report.model import Metric, Report, RunInfo, StepRow, encode_report

PEAK = "memory.peak_allocated_bytes.cuda:0"
UTIL = "device.utilization_pct"


def _report(peak: float, util: float = 60.0, step_us: float = 1000.0, contention: dict[str, float] | None = None, steps: int = 4) -> Report:
    """Four equal steps and two metrics without per-step samples: one lower-, one higher-is-better;
    `contention`: the manifest's figures of the capture's machine (capture/machine.py)."""
    manifest = {"environment": {"cpu_count": 2, "contention": contention}} if contention else {}
    return Report(
        torchscope_version="test", run=RunInfo(paths=[], trace_files=[], ranks=[0], device_kind="cuda", manifest=manifest),
        steps=[StepRow(rank=0, span=0, step=i, start_us=i * step_us, duration_us=step_us, breakdown={}) for i in range(steps)],
        breakdown={},
        metrics=[Metric(name=PEAK, value=peak, unit="bytes", better="lower"),
                 Metric(name=UTIL, value=util, unit="percent", better="higher")],
    )


def _words(text: str) -> str:
    """The terminal output with its line wrapping undone."""
    return " ".join(text.split())


def _saved(tmp_path: Path, name: str, report: Report) -> str:
    path = tmp_path / f"{name}.json"
    path.write_bytes(encode_report(report))
    return str(path)


def test_peak_memory_beyond_its_threshold_fails_the_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _saved(tmp_path, "base", _report(peak=1e9))
    more = _saved(tmp_path, "more", _report(peak=1.3e9))  # +30 %
    assert cli.main(["diff", base, more, "--fail-on", f"{PEAK}+10%"]) == 1
    out = _words(capsys.readouterr().out)
    assert "FAIL: Regression: " in out and f"{PEAK} +30.0 % (worse, beyond noise), limit 10 % worse" in out
    assert cli.main(["diff", base, more, "--fail-on", f"{PEAK}+50%"]) == 0  # beyond noise, within 50 %
    assert "PASS" in capsys.readouterr().out
    assert cli.main(["check", more, "--baseline", base, "--fail-on", f"{PEAK}+10%"]) == 1
    capsys.readouterr()


def test_less_memory_never_fails_and_several_thresholds_fail_on_any(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _saved(tmp_path, "base", _report(peak=1e9))
    less = _saved(tmp_path, "less", _report(peak=0.5e9))
    assert cli.main(["diff", base, less, "--fail-on", f"{PEAK}+1%"]) == 0
    assert "-50.0 % (not worse" in _words(capsys.readouterr().out)
    worse_util = _saved(tmp_path, "util", _report(peak=1e9, util=45.0))  # higher is better: -25 % is worse
    assert cli.main(["diff", base, worse_util, "--fail-on", f"{PEAK}+10%", "--fail-on", f"{UTIL}+10%"]) == 1
    out = _words(capsys.readouterr().out)
    failed = out.split("FAIL: ")[1]  # the paragraph names the failing check only
    assert f"{UTIL} -25.0 % (worse, beyond noise), limit 10 % worse" in failed and PEAK not in failed


def test_an_unsampled_metric_counts_as_changed_only_from_the_tolerance() -> None:
    # No per-step samples, so no interval: a change below UNSAMPLED_TOLERANCE_PCT is within noise even
    # over a smaller threshold; one just above it is beyond noise.
    small = 1 + 0.75 * UNSAMPLED_TOLERANCE_PCT / 100
    large = 1 + 1.5 * UNSAMPLED_TOLERANCE_PCT / 100
    threshold = [parse_threshold(f"{PEAK}+{0.5 * UNSAMPLED_TOLERANCE_PCT:g}%")]
    within = diff_reports(_report(1e9), _report(1e9 * small))
    peak = next(m for m in within.metrics if m.name == PEAK)
    assert not peak.significant and peak.verdict == "no significant change" and peak.ci_low_pct is None
    assert not evaluate(within, None, threshold).failed
    beyond = diff_reports(_report(1e9), _report(1e9 * large))
    peak = next(m for m in beyond.metrics if m.name == PEAK)
    assert peak.significant and peak.verdict == "worse"
    assert evaluate(beyond, None, threshold).failed


def test_a_metric_missing_from_a_report_is_not_checked_and_an_unknown_one_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _saved(tmp_path, "base", _report(peak=1e9))
    partial = _report(peak=2e9)
    partial.metrics = [m for m in partial.metrics if m.name != PEAK]
    other = _saved(tmp_path, "partial", partial)
    assert cli.main(["diff", base, other, "--fail-on", f"{PEAK}+10%"]) == 0
    assert f"{PEAK}: not in both runs, not checked" in _words(capsys.readouterr().out)
    assert cli.main(["diff", base, base, "--fail-on", "memory.peak_reserved_bytes.cpu+10%"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torchscope: error: no metric ") and err.count("\n") == 1


def test_a_run_captured_on_a_busy_machine_is_flagged_and_a_timing_failure_says_so() -> None:
    slower = _report(1e9, step_us=1300.0)  # +30 %: beyond the 4 % run-to-run floor
    quiet = {"cpus": 2, "load_average_1m": 1.2, "other_share": 0.05}
    busy = {"cpus": 2, "load_average_1m": 8.5, "other_share": 0.89}
    diff = diff_reports(_report(1e9, contention=quiet), slower)
    assert not any("busy machine" in w for w in diff.warnings)
    gate = evaluate(diff, 5.0, [])
    assert gate.failed and "Note:" not in gate.explanation
    diff = diff_reports(_report(1e9, contention=busy), slower)
    assert diff.warnings == ["the base run was captured on a busy machine (load average 8.5 on 2 CPUs, other processes used 89% "
                             "of its CPUs): its times carry that load, so timing verdicts may be the load, not the code"]
    gate = evaluate(diff, 5.0, [])
    assert gate.failed and gate.explanation.endswith(
        "Note: the base run was captured on a busy machine (see the warnings): a timing regression may be the load; "
        "rerun both on an idle machine before trusting it.")
    # A memory regression is not the load's doing: no note.
    more = _report(2e9, contention=busy)
    memory = evaluate(diff_reports(_report(1e9, contention=busy), more), None, [parse_threshold(f"{PEAK}+10%")])
    assert memory.failed and "Note:" not in memory.explanation
    # Either figure alone is enough: other processes busy on a machine whose load average is low.
    assert any("busy machine" in w for w in diff_reports(slower, _report(1e9, contention={"cpus": 2, "other_share": 0.4})).warnings)


def test_a_run_without_steps_never_passes_the_gate() -> None:
    # A capture whose only step the profiler's stop cut off: nothing measured, so no threshold can hold.
    gate = evaluate(diff_reports(_report(1e9), _report(1e9, steps=0)), 5.0, [])
    assert gate.failed and gate.explanation == (
        "No comparison: the new run holds no step, so nothing can be compared; capture complete steps on both sides.")
    assert evaluate(diff_reports(_report(1e9, steps=0), _report(1e9, steps=0)), None, []).failed
    # No threshold is checked against an empty side, and no note about a busy machine or a memory change.
    busy = {"cpus": 2, "load_average_1m": 8.5, "other_share": 0.89}
    gate = evaluate(diff_reports(_report(1e9, contention=busy), _report(1.3e9, steps=0)), 5.0, [parse_threshold(f"{PEAK}+10%")])
    assert gate.checks == ["the new run holds no step, so nothing can be compared"] and "Note:" not in gate.explanation
    assert "the new run holds no step (every step was cut off): its figures are zeros, not measurements" in (
        diff_reports(_report(1e9), _report(1e9, steps=0)).warnings)
