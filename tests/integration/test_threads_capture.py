"""A real capture (`torchscope run`) of a script that limits torch to one intra-op thread on a machine with
more cores: `compute.threads` reads the thread count the capture recorded and names the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope
from torchscope.capture.environment import physical_cores

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = """
import torch
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = model(torch.randn(256, 512)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.skipif((physical_cores(sorted(os.sched_getaffinity(0))) or 0) < 2, reason="needs 2 physical cores")
def test_one_thread_on_a_machine_with_more_cores(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}  # the script sets its threads
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "one_thread.py", env=env), jobs=1, use_cache=False)
    cores = report.run.manifest["environment"]["physical_cores"]
    finding = next(f for f in report.findings if f.id == "compute.threads")
    assert finding.evidence["torch_num_threads"] == 1
    assert f"torch.set_num_threads({cores})" in finding.recommendation
    assert {fix.target: fix.value for fix in finding.fixes} == {"torch.set_num_threads": cores}
