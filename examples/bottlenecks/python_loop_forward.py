"""Planted bottleneck: the forward pass loops over the samples of the batch in Python.

With TORCHSCOPE_EXAMPLE_FIXED=1 the script applies the fix its finding recommends (the same math on the whole batch at once), so
benchmarks/whatif_savings.py can measure the saving the what-if model predicted."""

import os

import torch

FIXED = os.environ.get("TORCHSCOPE_EXAMPLE_FIXED") == "1"


class PerSampleModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if FIXED:  # the same per-sample math, batched
            hidden = batch
            for _ in range(4):
                hidden = torch.tanh(self.proj(hidden)) + hidden * 0.5
            return self.head(hidden)
        outputs = []
        for sample in batch:  # one tiny op chain per sample instead of one batched op
            hidden = sample
            for _ in range(4):
                hidden = torch.tanh(self.proj(hidden)) + hidden * 0.5
            outputs.append(self.head(hidden))
        return torch.stack(outputs)


def main() -> None:
    torch.manual_seed(0)
    model = PerSampleModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(64, 16)
    target = torch.randint(0, 4, (64,))
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
