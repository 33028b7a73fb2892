"""A small CPU training loop for the CI regression-gate example (docs/ci.md) and its tests.

    python examples/ci/train_step_time.py --out runs/base [--num-workers N] [--extra-ms MS] [--extra-mb MB]

Profiles 6 steps (`--steps`) with torchscope.profile and prints the run directory. `--extra-ms` plants a
regression: that much more host work in every step; `--extra-mb` one in memory: that many more MB held
during every step (with `--profile-memory`). `--with-stack` records call sites.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import torchscope


class Samples(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((64,), float(index % 7)), index % 10


def decode_batch(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Collates a batch after ~15 ms of "decoding": one sleep per batch, so the step time barely moves
    with the machine's load (many short sleeps would each wait for a free core)."""
    time.sleep(0.015)
    return torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--extra-ms", type=float, default=0.0)
    parser.add_argument("--extra-mb", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=6, help="profiled steps")
    parser.add_argument("--with-stack", action="store_true", help="record Python call stacks (call sites)")
    parser.add_argument("--profile-memory", action="store_true", help="record allocations (peak memory)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one intra-op thread: step times that do not swing with the machine's load
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(), batch_size=32, num_workers=args.num_workers, collate_fn=decode_batch)
    with torchscope.profile(out=args.out, wait=1, warmup=1, active=args.steps, with_stack=args.with_stack,
                           profile_memory=args.profile_memory) as prof:
        for step, (x, y) in enumerate(loader):
            ballast = torch.ones(int(args.extra_mb * (1 << 20)), dtype=torch.uint8) if args.extra_mb else None
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.extra_ms:
                time.sleep(args.extra_ms / 1000)  # the planted regression
            del ballast  # held through the step: the planted memory regression
            prof.step()
            if step == args.steps + 2:
                break
    print(prof.run_dir)


if __name__ == "__main__":
    main()
