"""A real capture (`torchscope run`) of short epochs over a DataLoader with 2 workers: without
persistent_workers the step clock times the workers' turnover in one step of every epoch and the finding
names it; with persistent_workers=True (its fix) there is none, and the mean step falls as it predicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    data = TensorDataset(torch.randn(160, 64), torch.randint(0, 10, (160,)))
    loader = DataLoader(data, batch_size=32, num_workers=2, persistent_workers=sys.argv[1] == "persistent")
    model = nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(10):  # 5 batches an epoch
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
'''


def _run(tmp_path: Path, mode: str) -> tuple[torchscope.Report, dict]:
    out = capture(tmp_path, SCRIPT, "train.py", mode, options=("--no-stack",))
    times = json.loads(next(out.glob("run*.json")).read_text())["environment"]["step_times"]
    return torchscope.analyze(out, jobs=1, use_cache=False), times


def test_workers_restarted_every_epoch(tmp_path: Path) -> None:
    report, times = _run(tmp_path, "restarting")
    restarts = [us for us in times["unprofiled_loader_restart_us"] if us > 0]
    assert len(times["unprofiled_loader_restart_us"]) == len(times["unprofiled_step_us"])
    assert len(restarts) >= 4 and times["unprofiled_loader_restarts"] == len(restarts)  # one step in 5
    (finding,) = [f for f in report.findings if f.id == "data_loading.worker_restarts"]
    assert finding.evidence["steps_per_restart"] == pytest.approx(5, abs=1)
    assert finding.time_share_low > 0.1 and [fix.target for fix in finding.fixes] == ["persistent_workers"]
    persistent, persistent_times = _run(tmp_path, "persistent")
    assert "unprofiled_loader_restart_us" not in persistent_times  # started once, before the timed steps
    assert "data_loading.worker_restarts" not in {f.id for f in persistent.findings}
    # The fix's effect on the mean step, as the finding's low end predicts it (at least).
    mean = report.measurements.dataloader.unprofiled_step_mean_us
    fixed = sum(persistent_times["unprofiled_step_us"]) / len(persistent_times["unprofiled_step_us"])
    assert fixed < mean * (1 - 0.5 * finding.time_share_low)
