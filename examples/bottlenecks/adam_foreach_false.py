"""Planted bottleneck: Adam with foreach=False over hundreds of small parameter tensors.

With TORCHSCOPE_EXAMPLE_FIXED=1 the script applies the fix its finding recommends first on a CPU
(fused=True: Adam has a CPU fused kernel since PyTorch 2.4; foreach=True on an older torch), so
benchmarks/whatif_savings.py can measure the saving the what-if model predicted."""

import os

import torch

FIXED = os.environ.get("TORCHSCOPE_EXAMPLE_FIXED") == "1"


# The advised fix: Adam's CPU fused kernel where this torch has it (2.4 on), else foreach.
_FIX = {"fused": True} if tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 4) else {"foreach": True}


def main() -> None:
    torch.manual_seed(0)
    layers = []
    for _ in range(150):  # 300 small parameter tensors (weight + bias)
        layers += [torch.nn.Linear(8, 8), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    if FIXED:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **_FIX)
    data = torch.randn(4, 8)
    for _ in range(8):
        loss = model(data).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
