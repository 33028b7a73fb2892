"""Plain `torch.profiler` captures (no torchscope labels) on the CPU: with gradient accumulation every
micro-batch's forward is forward, not work 'outside the phases' (which outside_steps.work used to blame on
`aten::linear`, advising to move the model's own forward out of the step); with `optimizer.step(closure)`
(Lightning's automatic optimization, LBFGS) the closure's forward is forward, not the optimizer's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchscope
from torchscope.report.model import Report

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

HEADER = """
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import profile, schedule, ProfilerActivity
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
             on_trace_ready=lambda p: p.export_chrome_trace("trace.json")) as prof:
    for step in range(6):
"""
ACCUMULATION = """
        for micro in range(4):
            x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
            (F.cross_entropy(model(x), y) / 4).backward()
        opt.step()
        opt.zero_grad()
        prof.step()
"""
CLOSURE = """
        x, y = torch.randn(512, 256), torch.randint(0, 10, (512,))
        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        opt.step(closure)
        prof.step()
"""


def _run(tmp_path: Path, loop: str) -> tuple[Report, dict[str, float]]:
    """The training loop `loop` under the plain profiler, analysed: the report and its phases' percents."""
    (tmp_path / "train.py").write_text(HEADER + loop)
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    rep = torchscope.analyze(tmp_path / "trace.json", jobs=1, use_cache=False)
    return rep, {name: entry.percent for name, entry in rep.phases.items()}


def test_gradient_accumulation_forward_without_labels(tmp_path: Path) -> None:
    rep, phases = _run(tmp_path, ACCUMULATION)
    # Four forwards a step: the model's matmuls on 128x256 inputs, as long as a good part of the backward.
    assert phases["forward"] > 0.4 * phases["backward"] and phases["other"] < phases["forward"]
    assert "outside_steps.work" not in {f.id for f in rep.findings}
    assert rep.measurements.outside_steps.culprits_us_per_step.get("aten::linear", 0.0) == 0.0


def test_closure_forward_without_labels(tmp_path: Path) -> None:
    _, phases = _run(tmp_path, CLOSURE)
    # SGD's update of 4 tensors is a small part; the closure's forward of a 512-row batch is not.
    assert phases["forward"] > 0.3 * phases["backward"] and phases["optimizer"] < phases["forward"]
