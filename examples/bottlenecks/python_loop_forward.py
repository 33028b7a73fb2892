"""Planted bottleneck: the forward pass loops over the samples of the batch in Python."""

import torch


class PerSampleModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
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
