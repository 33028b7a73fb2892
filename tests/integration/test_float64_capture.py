"""Real captures (`torchscope run`) of one MLP trained in float64, two ways it happens: the default dtype set
to float64, and a float32 model converted with `.double()` to take NumPy's float64 arrays. compute.float64
names the ops and the fix that fits each; the same model in float32 has no such finding: Python numbers
in its arithmetic (0-dim double tensors to torch), a NumPy learning rate and the conversion of its NumPy
inputs (`from_numpy(a).float()`) are no float64 compute."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import math
import sys
import numpy as np
import torch

mode = sys.argv[1]
if mode == "default_dtype":
    torch.set_default_dtype(torch.float64)
model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.Tanh(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                            torch.nn.Linear(512, 1))
if mode == "double":
    model = model.double()
opt = torch.optim.SGD(model.parameters(), lr=np.float64(1e-3))
features, targets = np.random.rand(128, 128), np.random.rand(128, 1)  # float64, as NumPy makes them
for step in range(12):
    x, y = torch.from_numpy(features), torch.from_numpy(targets)
    if mode == "float32":
        x, y = x.float(), y.float()
    out = model(x.to(torch.get_default_dtype()) if mode == "default_dtype" else x)
    # Python numbers in the arithmetic: torch wraps each in a 0-dim double tensor, computed in float32.
    loss = torch.nn.functional.mse_loss(out * 0.5 / math.sqrt(4.0) + 1.0, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 4 == 0:
        print(float(loss))
'''


@pytest.mark.parametrize(("mode", "fix"), [("default_dtype", "torch.set_default_dtype"), ("double", "torch.Tensor.float")])
def test_float64_training_is_named_with_its_fix(tmp_path: Path, mode: str, fix: str) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", mode), jobs=1, use_cache=False)
    section = report.measurements.float64
    assert section.time_base == "host" and "aten::addmm" in section.by_op
    assert section.float64_us_per_step > 0.8 * section.typed_ops_us_per_step
    (finding,) = [f for f in report.findings if f.id == "compute.float64"]
    assert [f.target for f in finding.fixes] == [fix]
    assert 0 < finding.time_share_low < finding.time_share_high <= 0.6


def test_float32_training_has_no_float64_finding(tmp_path: Path) -> None:
    report = torchscope.analyze(capture(tmp_path, SCRIPT, "train.py", "float32"), jobs=1, use_cache=False)
    section = report.measurements.float64
    assert section.typed_ops_us_per_step > 0
    assert section.float64_us_per_step == 0 and section.by_op == {}
    assert "compute.float64" not in {f.id for f in report.findings}
