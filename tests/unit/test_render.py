"""Renderers: never crash on minimal input, present what the Report holds, and JSON round-trips."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import torchscope
from helpers.real_traces import TraceSet
from helpers.trace_builder import TraceBuilder
from torchscope.render.json import render_json
from torchscope.render.terminal import render_terminal
from torchscope.report.model import decode_report, encode_report

analyze = torchscope.analyze


def _minimal(tmp_path: Path) -> Path:
    b = TraceBuilder()
    b.op("aten::add", 0, 5)
    return b.write(tmp_path / "minimal.json")


def test_renderers_on_a_minimal_trace(tmp_path: Path) -> None:
    report = analyze(_minimal(tmp_path), jobs=1, use_cache=False)
    text = render_terminal(report, width=80)
    assert "no ProfilerStep markers" in text
    assert "aten::add" in text
    data = json.loads(render_json(report))
    assert data["schema_version"] == 2 and data["run"]["step_source"] == "whole_trace"


def test_json_round_trips_to_an_equal_report(real_traces: TraceSet) -> None:
    # The committed traces lack hta_nccl_rank0: two ranks of NCCL traffic have as much to round-trip.
    report = analyze(real_traces.pick("hta_nccl_rank0", "hta_two_ranks_nccl"), jobs=1, use_cache=False)
    assert report.findings and report.kernels and report.operators
    assert decode_report(encode_report(report)) == report


def test_reader_accepts_missing_newer_fields() -> None:
    minimal = {"torchscope_version": "0.0.1", "run": {"paths": [], "trace_files": [], "ranks": [], "device_kind": "cpu"},
               "steps": [], "breakdown": {}, "a_field_from_the_future": 1}
    report = decode_report(json.dumps(minimal).encode())
    assert report.findings == [] and report.device.present is False
    assert "Diagnosis" in render_terminal(report)


def test_terminal_report_shows_findings_first_with_cost_evidence_and_fix(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("resnet50_num_workers_0"), jobs=1, use_cache=False)
    text = render_terminal(report, width=160)
    diagnosis = text.index("Diagnosis")
    assert diagnosis < text.index("Step time breakdown") < text.index("Top operators")
    first = report.findings[0]
    assert text.index(first.title[:40]) < text.index(report.findings[1].title[:40])
    assert f"a fix saves ~{100 * first.time_share:.1f}% of the step, " in text
    assert "evidence:" in text and "fix:" in text
    assert "\x1b[" not in text  # no colour codes unless asked
    assert "\x1b[" in render_terminal(report, width=160, color=True)


def test_cli_json_to_file_and_terminal_to_stdout(real_traces: TraceSet, tmp_path: Path) -> None:
    trace = real_traces.folder("tb_unit") / "gpu_metrics_input.json"
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "torchscope", "analyze", str(trace), "--format", "json", "-o", str(out), "--no-cache"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert json.loads(out.read_text())["findings"]
    done = subprocess.run([sys.executable, "-m", "torchscope", "analyze", str(trace), "--no-cache", "--by-shape"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Top operators by input shape" in done.stdout


@pytest.mark.parametrize("argv", [["analyze"], ["analyze", "x", "--format", "xml"], ["nonsense"], ["analyze", "x", "--jobs", "0"]])
def test_cli_usage_errors_are_one_line_and_exit_2(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "torchscope", *argv], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


def test_control_characters_in_trace_names_are_escaped(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(1, 0, 100)
    b.op("evil\x1b[2J\x1b[31mname\r\nnext", 10, 50)
    report = analyze(b.write(tmp_path / "evil.json"), jobs=1, use_cache=False)
    text = render_terminal(report, width=200)
    assert "\x1b" not in text and "\r" not in text
    assert "evil\\x1b[2J" in text


def test_top_must_be_positive(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "torchscope", "analyze", str(_minimal(tmp_path)), "--top", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--top" in done.stderr and "Traceback" not in done.stderr


def test_progress_bar_is_silent_for_short_loads_and_off_without_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    from torchscope.cli.progress import load_progress

    with load_progress(enabled=False) as progress:
        assert progress is None
    with load_progress(enabled=True) as progress:
        assert progress is not None
        progress(1, 2)
        progress(2, 2)
    assert capsys.readouterr().err == ""


def test_evidence_with_none_or_text_inside_a_timed_dict_renders() -> None:
    # A plug-in's rule (or an older report) may put None beside numbers in a per-rank *_us dict.
    finding = {"id": "straggler.x", "category": "straggler", "severity": "warning", "title": "Rank 1 is late",
               "time_share": 0.2, "recommendation": "look at rank 1",
               "evidence": {"late_us_per_rank": {"0": None, "1": 1500.0, "2": "n/a"}}}
    minimal = {"schema_version": 2, "torchscope_version": "0.0.1",
               "run": {"paths": [], "trace_files": [], "ranks": [0, 1, 2], "device_kind": "cpu"},
               "steps": [], "breakdown": {}, "findings": [finding]}
    text = render_terminal(decode_report(json.dumps(minimal).encode()), width=120)
    assert "late_us_per_rank={0: None, 1: 1,500 us, 2: n/a}" in text
