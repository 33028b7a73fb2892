"""A real capture (`torchscope run`) of a training loop left with autograd's anomaly detection on: the
trace's NaN checks (and, with stacks, the saved stacks) make a finding that costs a large share of the step;
with `check_nan=False` and no stacks the trace holds nothing of it, and the manifest's flag (seen at a step
boundary, inside a `detect_anomaly()` block that ends before the capture does) still names it. The same loop
without anomaly mode has no such finding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import contextlib, sys
import torch
from torch import nn

mode = sys.argv[1]
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if mode == "on":
    torch.autograd.set_detect_anomaly(True)
block = torch.autograd.detect_anomaly(check_nan=False) if mode == "block" else contextlib.nullcontext()
with block:
    for step in range(10):
        x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def _run(tmp_path: Path, mode: str, *options: str) -> tuple[torchscope.Report, dict]:
    out = capture(tmp_path, SCRIPT, "train.py", mode, options=options)
    manifest = json.loads(next(out.glob("run*.json")).read_text())
    return torchscope.analyze(out, jobs=1, use_cache=False), manifest


def _anomaly(report: torchscope.Report) -> list:
    return [f for f in report.findings if f.id == "host_overhead.anomaly_mode"]


def test_anomaly_mode_on_is_found_and_costed(tmp_path: Path) -> None:
    report, manifest = _run(tmp_path, "on")
    assert manifest["environment"]["anomaly_mode"] is True
    anomaly = report.measurements.anomaly
    # Each backward node's outputs are checked (the Linear layers' nodes have 2-3 outputs, the loss's 1).
    assert anomaly.nan_checks_per_step >= 5 and anomaly.nan_check_us_per_step > 0
    assert anomaly.stack_captures_per_step >= 5 and anomaly.stack_capture_us_per_step > 0
    (finding,) = _anomaly(report)
    assert finding.severity in ("warning", "critical") and finding.time_share > 0.05
    assert finding.fixes[0].value == "torch.autograd.set_detect_anomaly(False)"
    assert report.findings[0].id == "host_overhead.anomaly_mode"  # the costliest


def test_anomaly_checks_without_stacks(tmp_path: Path) -> None:
    report, _ = _run(tmp_path, "on", "--no-stack")
    (finding,) = _anomaly(report)
    assert finding.evidence["nan_checks_per_step"] >= 5 and finding.evidence["stack_captures_per_step"] == 0
    assert finding.time_share > 0 and "with_stack=True" in finding.recommendation


def test_anomaly_mode_seen_only_by_the_capture(tmp_path: Path) -> None:
    report, manifest = _run(tmp_path, "block", "--no-stack")
    assert manifest["environment"]["anomaly_mode"] is True  # on at the step boundaries, off at the end
    assert report.measurements.anomaly.nan_checks_per_step == 0
    (finding,) = _anomaly(report)
    assert finding.time_share is None and "not measured" in finding.title


def test_no_anomaly_finding_without_it(tmp_path: Path) -> None:
    report, manifest = _run(tmp_path, "off")
    assert manifest["environment"]["anomaly_mode"] is False
    assert not _anomaly(report) and report.measurements.anomaly.nan_checks_per_step == 0
