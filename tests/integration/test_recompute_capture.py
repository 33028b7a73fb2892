"""A real capture (`torchscope run`) of a model whose blocks run under activation checkpointing: each block's
forward runs again in the backward, and compute.recompute says how much that costs; the same model without
checkpointing has no such finding."""

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
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))

    def forward(self, x):
        return x + self.f(x)


blocks = nn.ModuleList(Block() for _ in range(4))
head = nn.Linear(128, 10)
opt = torch.optim.SGD([*blocks.parameters(), *head.parameters()], lr=0.01)
for step in range(12):
    x = torch.randn(32, 128)
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False) if sys.argv[1] == "checkpointed" else block(x)
    loss = nn.functional.cross_entropy(head(x), torch.randint(0, 10, (32,)))
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_recomputed_blocks_are_measured(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "checkpointed"), jobs=1, use_cache=False)
    section = report.measurements.recompute
    assert section.recomputed_calls_per_step == 4 and section.time_base == "host"
    assert section.recompute_us_per_step > 0 and section.bookkeeping_us_per_step > 0
    assert set(section.modules_us_per_step) == {f"nn.Module: Block_{i}" for i in range(4)}
    (finding,) = [f for f in report.findings if f.id == "compute.recompute"]
    assert 0 < finding.time_share_low <= finding.time_share <= finding.time_share_high <= 1
    plain = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "plain"), jobs=1, use_cache=False)
    assert plain.measurements.recompute.recomputed_calls_per_step == 0
    assert "compute.recompute" not in {f.id for f in plain.findings}
