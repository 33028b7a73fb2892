"""Planted bottleneck: a Dataset whose __getitem__ is slow, loaded with num_workers=0.

With TORCHSCOPE_EXAMPLE_FIXED=1 the script applies the fix its finding recommends (num_workers=2, or the
workers and intra-op threads the finding advised on this machine: TORCHSCOPE_EXAMPLE_NUM_WORKERS and
TORCHSCOPE_EXAMPLE_NUM_THREADS, which benchmarks/whatif_savings.py sets), so the benchmark can measure the
saving the what-if model predicted."""

import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

FIXED = os.environ.get("TORCHSCOPE_EXAMPLE_FIXED") == "1"
WORKERS = int(os.environ.get("TORCHSCOPE_EXAMPLE_NUM_WORKERS") or 2)
THREADS = int(os.environ.get("TORCHSCOPE_EXAMPLE_NUM_THREADS") or 0)


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int):
        time.sleep(0.0015)  # stands for decoding/augmenting one sample in Python
        return torch.randn(64), index % 10


def main() -> None:
    torch.manual_seed(0)
    if FIXED and THREADS:
        torch.set_num_threads(THREADS)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=32, num_workers=WORKERS if FIXED else 0)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 9:
            break


if __name__ == "__main__":
    main()
