"""Real captures (`torchscope run`) of a sequence model stepping an nn.LSTMCell through time from Python, and
the same model as one nn.LSTM call: the loop's findings say to run the sequence through nn.LSTM (no indexing
op can replace a recurrence), and the fused model has no cell loop. (On the project's 2-core machine the
loop ran 12.6 ms a step against 5.8 ms with nn.LSTM; host_overhead.dispatch said 73.5 % (52.6-94.4 %).)"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = """
import sys
import torch

T, B, H = 24, 16, 64


class CellLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell, self.out = torch.nn.LSTMCell(H, H), torch.nn.Linear(H, 10)

    def forward(self, x):
        h = c = torch.zeros(x.shape[1], H)
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
        return self.out(h)


class Sequence(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.out = torch.nn.LSTM(H, H), torch.nn.Linear(H, 10)

    def forward(self, x):
        return self.out(self.lstm(x)[0][-1])


model = CellLoop() if sys.argv[1] == "loop" else Sequence()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(T, B, H), torch.randint(0, 10, (B,))
for step in range(12):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_cell_loop_is_told_to_use_the_sequence_module(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "loop"), jobs=1, use_cache=False)
    patterns = report.measurements.patterns
    assert (patterns.recurrent_cells_per_step, patterns.recurrent_cell) == (24, "aten::lstm_cell")
    named = [f for f in report.findings if f.id in ("host_overhead.indexing_loop", "host_overhead.dispatch")]
    assert named and all("nn.LSTM" in f.recommendation for f in named)
    loop = [f for f in named if f.id == "host_overhead.indexing_loop"]
    assert all([fix.target for fix in f.fixes] == ["nn.LSTM"] for f in loop)

    fused = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "sequence"), jobs=1, use_cache=False)
    assert fused.measurements.patterns.recurrent_cells_per_step == 0
    assert not any("recurrent cell" in f.title or "recurrent cell" in f.recommendation for f in fused.findings)
