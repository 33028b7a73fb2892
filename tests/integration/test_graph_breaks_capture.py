"""Real captures (`torchscope run`) of a torch.compile'd MLP, with a data-dependent branch on a tensor's
value in every block (a graph break each) and without: compute.graph_breaks counts the graphs, names the
line it breaks at and costs the time between graphs; the model compiled whole has no such finding. (On the
project's 2-core machine the breaks made the unprofiled step 6.67 ms against 5.00 ms; the finding said
17.8 % (12.5-23.1 %), the fusion lost across the breaks not counted.)"""

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

BREAK = sys.argv[1] == "break"


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if BREAK and float(h.mean()) > 1e9:  # reads a value: dynamo breaks the graph here
            h = h * 0
        return x + self.b(h)


class Net(torch.nn.Module):  # a root module of its own: dynamo also compiles the capture's phase hooks on it
    def __init__(self):
        super().__init__()
        self.blocks, self.head = torch.nn.ModuleList(Block() for _ in range(4)), torch.nn.Linear(128, 10)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = Net()
compiled = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
for step in range(16):
    loss = torch.nn.functional.cross_entropy(compiled(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_graph_breaks_are_counted_located_and_costed(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "break"), jobs=1, use_cache=False)
    breaks = report.measurements.graph_breaks
    assert (breaks.graphs_per_step, breaks.compiled_calls_per_step, breaks.breaks_per_step) == (8, 1, 7)
    assert breaks.locations == {"forward (train.py:15)": 4}
    (found,) = [f for f in report.findings if f.id == "compute.graph_breaks"]
    assert "at forward (train.py:15)" in found.title and found.time_share_low > 0

    whole = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "whole"), jobs=1, use_cache=False)
    assert (whole.measurements.graph_breaks.graphs_per_step, whole.measurements.graph_breaks.breaks_per_step) == (1, 0)
    assert "compute.graph_breaks" not in {f.id for f in whole.findings}
