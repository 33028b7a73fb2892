"""A plain `torch.profiler` capture (no torchscope labels) of gradient accumulation on the CPU: every
micro-batch's forward is forward, not work 'outside the phases' (which outside_steps.work used to blame on
`aten::linear`, advising to move the model's own forward out of the step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = """
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import profile, schedule, ProfilerActivity
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
             on_trace_ready=lambda p: p.export_chrome_trace("trace.json")) as prof:
    for step in range(6):
        for micro in range(4):
            x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
            (F.cross_entropy(model(x), y) / 4).backward()
        opt.step()
        opt.zero_grad()
        prof.step()
"""


def test_gradient_accumulation_forward_without_labels(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    rep = torchscope.analyze(tmp_path / "trace.json", jobs=1, use_cache=False)
    phases = {name: entry.percent for name, entry in rep.phases.items()}
    # Four forwards a step: the model's matmuls on 128x256 inputs, as long as a good part of the backward.
    assert phases["forward"] > 0.4 * phases["backward"] and phases["other"] < phases["forward"]
    assert "outside_steps.work" not in {f.id for f in rep.findings}
    assert rep.measurements.outside_steps.culprits_us_per_step.get("aten::linear", 0.0) == 0.0
