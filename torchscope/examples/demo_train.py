"""A small CPU training run with a planted data-loading bottleneck (the workload of ``torchscope demo``).

A little CNN learns to classify synthetic 32x32 images. Each sample is "decoded and augmented" on the
fly -- made at 96x96, blurred a few times, resized -- the kind of per-sample CPU work a real image
pipeline does. With ``num_workers=0`` that work runs in the training loop, between steps, and takes most
of the step: the diagnosis should say so, name the costly calls of ``__getitem__``, and advise DataLoader
workers only where the machine has the cores for them (on 2 cores the fetch's torch ops already keep both
intra-op threads busy, and a worker, which runs one thread, would not make the step faster).

    python -m torchscope.examples.demo_train [--steps N] [--num-workers N] [--threads N]
    torchscope run -m torchscope.examples.demo_train --num-workers N   # workers, where the finding advises them

Nothing is downloaded; everything is generated from the sample index (deterministic).
"""

from __future__ import annotations

import argparse
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

IMAGE_SIZE = 32
SOURCE_SIZE = 96  # the "decoded" image before augmentation
BLUR_PASSES = 3
NUM_CLASSES = 10


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Synthetic labelled images with deliberately expensive per-sample preprocessing."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        label = index % NUM_CLASSES
        image = torch.rand(3, SOURCE_SIZE, SOURCE_SIZE, generator=generator) + label / NUM_CLASSES
        for _ in range(BLUR_PASSES):  # the planted bottleneck: per-sample CPU work in the loader
            image = F.avg_pool2d(F.pad(image[None], (1, 1, 1, 1), mode="reflect"), 3, stride=1)[0]
        image = F.interpolate(image[None], size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)[0]
        return image, label


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (IMAGE_SIZE // 4) ** 2, NUM_CLASSES),
    )


def train(steps: int, batch_size: int, num_workers: int) -> float:
    """Train for ``steps`` optimizer steps; returns the last loss."""
    torch.manual_seed(0)
    loader = DataLoader(
        SyntheticImages(steps * batch_size), batch_size=batch_size, shuffle=True, num_workers=num_workers
    )
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss = torch.zeros(())
    for images, labels in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="training steps (default 12)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (default 0: the bottleneck)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default 0: torch's)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    last_loss = train(args.steps, args.batch_size, args.num_workers)
    print(f"demo_train: {args.steps} steps, batch {args.batch_size}, num_workers={args.num_workers}, "
          f"last loss {last_loss:.3f}")


if __name__ == "__main__":
    main()
