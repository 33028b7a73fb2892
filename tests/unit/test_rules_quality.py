"""Trace-quality rules on hand-built Reports, and the severity caps they imply for the other findings."""

from __future__ import annotations

from test_rules_support import finding, findings, fixes, gpu, report
from torchscope.report.measurements import Compile, DataLoader, Measurements

SCHEDULE = {"wait": ("profiler_option", 1), "warmup": ("profiler_option", 1), "active": ("profiler_option", 3)}
LOADING = Measurements(dataloader=DataLoader(single_process_fetches=4))


def test_no_steps_caps_every_other_finding_at_info() -> None:
    rep = report(measurements=LOADING, breakdown={"data_loading": 0.5}, steps=1, step_source="whole_trace")
    f = finding(rep, "trace_quality.no_steps")
    assert (f.category, f.severity, f.time_share) == ("trace_quality", "warning", None)
    assert f.evidence == {"step_source": "whole_trace"}
    assert fixes(f) == {"Profiler.step": ("code_change", "prof.step()"), **SCHEDULE}
    assert finding(rep, "data_loading.exposed").severity == "info"  # 50 % of the window, but no steps
    assert "trace_quality.few_steps" not in findings(rep)
    assert "trace_quality.no_steps" not in findings(report())


def test_few_steps_caps_other_findings_at_warning() -> None:
    rep = report(measurements=LOADING, breakdown={"data_loading": 0.5}, steps=2)
    f = finding(rep, "trace_quality.few_steps")
    assert (f.severity, f.time_share, f.evidence) == ("warning", None, {"steps": 2, "minimum": 3})
    assert fixes(f) == SCHEDULE
    assert finding(rep, "data_loading.exposed").severity == "warning"
    three = report(measurements=LOADING, breakdown={"data_loading": 0.5}, steps=3)
    assert "trace_quality.few_steps" not in findings(three)
    assert finding(three, "data_loading.exposed").severity == "critical"


def test_warmup_steps_in_the_window() -> None:
    f = finding(report(first_step=0), "trace_quality.warmup_in_window")
    assert (f.severity, f.time_share, f.evidence) == ("info", None, {"early_steps": [0, 1]})
    assert fixes(f) == {"wait": SCHEDULE["wait"], "warmup": SCHEDULE["warmup"]}
    assert "trace_quality.warmup_in_window" not in findings(report(first_step=2))
    assert "trace_quality.warmup_in_window" not in findings(report(first_step=0, step_source="whole_trace"))


def test_outlier_steps() -> None:
    f = finding(report(durations=[10_000.0, 10_000.0, 10_000.0, 16_000.0]), "trace_quality.outlier_steps")
    assert (f.severity, f.time_share) == ("info", None)
    assert f.title == "1 step(s) took over 1.5x the median step time"
    assert f.evidence == {"outlier_steps": [8], "median_step_us": 10_000.0, "max_step_us": 16_000.0}
    assert f.fixes == []
    assert "trace_quality.outlier_steps" not in findings(report(durations=[10_000.0, 10_000.0, 10_000.0, 15_000.0]))
    assert "trace_quality.outlier_steps" not in findings(report(durations=[10_000.0, 40_000.0]))  # too few steps


def test_compilation_in_the_window() -> None:
    compiled = Measurements(compile=Compile(compilation_us_per_step=2000.0))
    f = finding(report(measurements=compiled), "trace_quality.compilation_in_window")
    assert (f.severity, f.time_share, f.evidence) == ("warning", 0.2, {"compilation_us_per_step": 2000.0})
    # Steps 5..8 were profiled: start recording after them.
    assert fixes(f) == {"skip_first": ("profiler_option", 9), "TORCH_LOGS": ("env_var", "recompiles")}
    unnumbered = finding(report(measurements=compiled, step_source="whole_trace"), "trace_quality.compilation_in_window")
    assert fixes(unnumbered)["skip_first"] == ("profiler_option", None)
    assert "trace_quality.compilation_in_window" not in findings(report())


def test_cuda_requested_but_no_device_events() -> None:
    manifest = {"activities": ["cpu", "cuda"]}
    f = finding(report(manifest=manifest), "trace_quality.no_device_events")
    assert (f.severity, f.time_share, f.evidence) == ("warning", None, {"activities": ["cpu", "cuda"]})
    assert f.fixes == []
    assert "trace_quality.no_device_events" not in findings(report(manifest=manifest, device=gpu()))
    assert "trace_quality.no_device_events" not in findings(report(manifest={"activities": ["cpu"]}))


def test_partial_trace() -> None:
    warnings = [f"warning {i}" for i in range(7)]
    f = finding(report(partial=True, warnings=warnings, manifest={"status": "interrupted"}), "trace_quality.partial")
    assert (f.severity, f.time_share) == ("info", None)
    assert f.evidence == {"warnings": warnings[:5], "status": "interrupted"}
    assert "trace_quality.partial" not in findings(report())


def _captured(steps_seen: int, **schedule: int) -> dict[str, object]:
    return {"schedule": {"skip_first": 0, "wait": 1, "warmup": 1, "active": 3, "repeat": 1, **schedule}, "steps_seen": steps_seen}


def test_few_steps_says_when_the_run_ended_inside_the_window() -> None:
    # A 3-iteration script under the default schedule: step 2 alone is recorded, and no schedule helps.
    f = finding(report(steps=1, manifest=_captured(2)), "trace_quality.few_steps")
    assert "the run ended at step 2, inside the profiled window" in f.title
    assert (f.evidence["last_step"], f.evidence["first_recorded_step"]) == (2, 2)
    assert "Run more iterations (6 or more)" in f.recommendation and "--wait 0" not in f.recommendation
    # A longer script under a later window: starting earlier would record 3 steps.
    f = finding(report(steps=2, manifest=_captured(6, wait=4, warmup=1)), "trace_quality.few_steps")
    assert "--skip-first 0 --wait 0 --warmup 1 records steps 1-3" in f.recommendation
    # A run that failed there says so first.
    f = finding(report(steps=2, manifest={**_captured(3), "status": "error"}), "trace_quality.few_steps")
    assert "the run failed at step 3" in f.title and f.recommendation.startswith("Let the run finish")
    # A complete window of 2 active steps is the user's choice: the general advice.
    f = finding(report(steps=2, manifest=_captured(9, active=2)), "trace_quality.few_steps")
    assert "ended" not in f.title and "last_step" not in f.evidence
