"""Planted bottleneck: a full checkpoint (model + optimizer state) is written after every step.

With TORCHSCOPE_EXAMPLE_FIXED=1 the script applies the fix its finding recommends (a checkpoint every 100 steps), so
benchmarks/whatif_savings.py can measure the saving the what-if model predicted."""

import os
import tempfile

import torch

FIXED = os.environ.get("TORCHSCOPE_EXAMPLE_FIXED") == "1"
EVERY = 100 if FIXED else 1


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        # A large non-trainable table (think vocabulary statistics): cheap to use, heavy to save.
        self.register_buffer("table", torch.randn(4_000_000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) + self.table[:10]


def save_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def main() -> None:
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(32, 128)
    with tempfile.TemporaryDirectory() as folder:
        for step in range(8):
            loss = model(data).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if (step + 1) % EVERY == 0:
                save_checkpoint(model, optimizer, os.path.join(folder, f"step{step}.pt"))


if __name__ == "__main__":
    main()
