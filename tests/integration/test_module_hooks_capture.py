"""A real capture (`torchscope run`, stacks on) of a model with forward hooks that read activation statistics
(three .item() calls each) at every module call: host_overhead.module_hooks names the hook and its cost; the
model's own forward methods are not hooks, and without the hooks there is no such finding."""

from __future__ import annotations

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


class Block(nn.Module):  # a user module: its forward is not a hook
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.linear(x))


model = nn.Sequential(*[Block() for _ in range(6)], nn.Linear(64, 10))
stats = {}


def record(module, inputs, output):
    stats[id(module)] = (output.mean().item(), output.std().item(), output.abs().max().item())


if sys.argv[1] == "hooked":
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(record)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12):
    loss = nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_module_hooks_are_named_and_costed(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "hooked"), jobs=1, use_cache=False)
    hooks = report.measurements.module_hooks
    assert hooks.calls_per_step == 7 and list(hooks.hooks_us_by_name) == ["record (train.py:20)"]
    (finding,) = [f for f in report.findings if f.id == "host_overhead.module_hooks"]
    assert "mostly in record (train.py:20)" in finding.title and finding.time_share_low > 0
    plain = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "plain"), jobs=1, use_cache=False)
    assert plain.measurements.module_hooks.calls_per_step == 0
    assert "host_overhead.module_hooks" not in {f.id for f in plain.findings}
