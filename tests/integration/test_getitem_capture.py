"""A real capture (`torchscope run`, stacks on, num_workers=0) of a script whose step also calls library
`__getitem__`s, as real models do (`ModuleList[i]`, a `UserDict` config, `os.environ`): the data-loading
finding names the Dataset's own frame and its costly call, never torch's or the standard library's
(PyTorch's tracer writes their paths relative to sys.path: `torch/nn/modules/container.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import os, time
from collections import UserDict
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.001)
        return torch.randn(32), i % 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(32, 32) for _ in range(4))
        self.config = UserDict(scale=0.5)

    def forward(self, x):
        for i in range(len(self.layers)):
            x = torch.relu(self.layers[i](x)) * self.config["scale"]
        return x[:, :4]


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Slow(), batch_size=16, num_workers=0)):
    os.environ.get("HOME")
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 6:
        break
'''


def test_finding_names_the_datasets_getitem_not_a_librarys(tmp_path: Path) -> None:
    script = tmp_path / "train_modulelist.py"
    script.write_text(SCRIPT)
    run = subprocess.run(
        [sys.executable, "-m", "torchscope", "run", "--out", str(tmp_path / "run"), "--no-report", str(script)],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    trace = next((tmp_path / "run").glob("*.pt.trace.json*")).read_text()
    assert "torch/nn/modules/container.py(" in trace and "): __getitem__" in trace  # the library frames are there
    report = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False)
    getitem = report.measurements.getitem
    line = SCRIPT.splitlines().index("    def __getitem__(self, i):") + 1
    assert getitem.frames == [f"__getitem__ (train_modulelist.py:{line})"]
    assert next(iter(getitem.calls_us_per_step)) == "sleep"
    loading = next(f for f in report.findings if f.category == "data_loading")
    assert f"__getitem__ (train_modulelist.py:{line}): sleep" in loading.recommendation
