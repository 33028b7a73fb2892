"""Planted bottleneck: Adam with foreach=False over hundreds of small parameter tensors."""

import torch


def main() -> None:
    torch.manual_seed(0)
    layers = []
    for _ in range(150):  # 300 small parameter tensors (weight + bias)
        layers += [torch.nn.Linear(8, 8), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    data = torch.randn(4, 8)
    for _ in range(8):
        loss = model(data).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
