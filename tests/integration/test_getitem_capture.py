"""A real capture (`torchscope run`, stacks on, num_workers=0) of a script whose step also calls library
`__getitem__`s, as real models do (`ModuleList[i]`, a `UserDict` config, `os.environ`): the data-loading
finding names the Dataset's own frame and its costly call, never torch's or the standard library's
(PyTorch's tracer writes their paths relative to sys.path: `torch/nn/modules/container.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.capture_run import capture
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
    run_dir = capture(tmp_path, SCRIPT, "train_modulelist.py")
    trace = next(run_dir.glob("*.pt.trace.json*")).read_text()
    assert "torch/nn/modules/container.py(" in trace and "): __getitem__" in trace  # the library frames are there
    report = torchscope.analyze(run_dir, jobs=1, use_cache=False)
    getitem = report.measurements.getitem
    line = SCRIPT.splitlines().index("    def __getitem__(self, i):") + 1
    assert getitem.frames == [f"__getitem__ (train_modulelist.py:{line})"]
    assert next(iter(getitem.calls_us_per_step)) == "sleep"
    loading = next(f for f in report.findings if f.category == "data_loading")
    assert f"__getitem__ (train_modulelist.py:{line}): sleep" in loading.recommendation


COLLATE_SCRIPT = '''
import torch
from torch.utils.data import DataLoader, Dataset

WORDS = [f"w{i}" for i in range(500)]
VOCAB = {w: i for i, w in enumerate(WORDS)}
TEXTS = [" ".join(WORDS[(i * 7 + j) % 500] for j in range(256)) for i in range(2048)]


class Texts(Dataset):
    def __len__(self):
        return len(TEXTS)

    def __getitem__(self, i):
        return TEXTS[i]


def collate(texts):
    return torch.tensor([[VOCAB[w] for w in t.split()] for t in texts])  # tokenizing in the collate_fn


model = torch.nn.Sequential(torch.nn.Embedding(500, 64), torch.nn.Flatten(), torch.nn.Linear(64 * 256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, x in enumerate(DataLoader(Texts(), batch_size=64, collate_fn=collate)):
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 8:
        break
'''


def test_a_costly_collate_fn_is_named_instead_of_getitem(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, COLLATE_SCRIPT, "train_collate.py"), jobs=1, use_cache=False)
    getitem = report.measurements.getitem
    line = COLLATE_SCRIPT.splitlines().index("def collate(texts):") + 1
    (name, us), = getitem.collate_us_per_step.items()  # torch's fetch also calls hasattr: not a collate
    assert name == f"collate (train_collate.py:{line})" and us > 10 * getitem.getitem_us_per_step
    loading = next(f for f in report.findings if f.id == "data_loading.exposed")
    assert f"The collate_fn, collate (train_collate.py:{line})" in loading.recommendation
    assert "__getitem__" not in loading.recommendation  # a few microseconds of the fetch
    fixes = {fix.target: fix.value for fix in loading.fixes}
    assert fixes.get("collate_fn") == f"collate (train_collate.py:{line})" and "Dataset.__getitem__" not in fixes
