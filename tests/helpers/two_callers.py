"""A small real CPU training run in which two callers (`_train_step`, three times per step, and
`_evaluate`, once) reach the same operators through one function (`_layer`): the case where an
operator's call site has more than one call stack (analysis/callsites.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _layer(model: Any, x: Any) -> Any:
    return model(x)


def _train_step(model: Any, optimizer: Any, x: Any) -> None:
    loss = _layer(model, x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _evaluate(model: Any, x: Any) -> Any:
    import torch

    with torch.no_grad():
        return _layer(model, x)


def two_callers_run(out: Path) -> Path:
    import torch

    import torchscope

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    with torchscope.profile(out=out, wait=0, warmup=1, active=3, profile_memory=False) as prof:
        for _ in range(4):
            for _ in range(3):
                _train_step(model, optimizer, x)
            _evaluate(model, x)
            prof.step()
    return out
