"""Memory step by step: churn inside each step and growth across steps.

Churn is the allocator traffic of a step: bytes and count allocated and freed in it, and the temporaries
(blocks allocated and freed inside the same step). The churn the rules judge leaves out blocks allocated
or freed in the forward and backward phases: there autograd's saved activations and gradients come and go
every step by design (on a real model they are as large as the peak), and only the other temporaries are
a choice of the code (a buffer rebuilt each step, a metric computed on a copy). Growth is the allocated total at the step boundaries
fitted with a line: the Theil-Sen slope (median of the pairwise slopes, robust to one odd step such as
the first optimizer step creating its state) with Sen's 90 % confidence interval, and the least-squares
R^2 saying how straight the line is. A leak's allocating sites are those whose blocks, allocated in an
earlier step, are still alive at the end of the last step.
"""

from __future__ import annotations

import math

import msgspec
import numpy as np

from torchscope.analysis.memory_blocks import Blocks, DeviceMemory
from torchscope.analysis.steps import StepWindows
from torchscope.arrays import median
from torchscope.report.model import MemoryGrowth, MemoryStepRow

CONFIDENCE_Z = 1.645  # two-sided 90 %
UNKNOWN_SITE = "(unknown)"  # the name of the blocks with no call site (a trace without stacks)


class StepTraffic(msgspec.Struct, frozen=True):
    """Per-step allocator figures of one device (arrays with one entry per step)."""

    at_start: np.ndarray
    at_end: np.ndarray
    alloc_bytes: np.ndarray
    alloc_count: np.ndarray
    free_bytes: np.ndarray
    free_count: np.ndarray
    temporary_bytes: np.ndarray
    churn_bytes: np.ndarray  # temporaries neither allocated nor freed in forward/backward
    churn_codes: np.ndarray  # site code per such block (for churn sites)
    churn_block_bytes: np.ndarray

    def rows(self, device: str, numbers: np.ndarray) -> list[MemoryStepRow]:
        return [
            MemoryStepRow(
                device=device, step=int(numbers[i]), allocated_at_start_bytes=int(self.at_start[i]),
                allocated_at_end_bytes=int(self.at_end[i]), alloc_bytes=int(self.alloc_bytes[i]),
                alloc_count=int(self.alloc_count[i]), free_bytes=int(self.free_bytes[i]),
                free_count=int(self.free_count[i]), temporary_bytes=int(self.temporary_bytes[i]),
            )
            for i in range(numbers.size)
        ]  # fmt: skip


def step_bounds(memory: DeviceMemory, steps: StepWindows) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the positions of its first event and of the first event after it."""
    return np.searchsorted(memory.ts_us, steps.start_us, side="left"), np.searchsorted(memory.ts_us, steps.end_us, side="left")


def step_traffic(
    memory: DeviceMemory, blocks: Blocks, steps: StepWindows, site_codes: np.ndarray, autograd: np.ndarray,
    unseen_frees: np.ndarray | None = None,
) -> StepTraffic:
    """Allocator traffic per step (`site_codes`: the call-site code of each block in `blocks`;
    `autograd`: per memory event, whether it happens in the forward or backward phase; `unseen_frees`:
    per event position, bytes of frees the trace lacks that the totals were corrected for, counted as
    frees there so that each step's rows still balance)."""
    n = len(steps)
    lo, hi = step_bounds(memory, steps)
    before = np.r_[memory.allocated_before, memory.allocated[-1:]]  # allocated total before position i
    positive = np.maximum(memory.nbytes, 0)
    negative = np.maximum(-memory.nbytes, 0)
    # A free the trace lacked happened before the allocation at `unseen_frees`' position, and the totals
    # drop from that position on: it belongs with the event before it (the step that ends there, if any).
    unseen = np.zeros(memory.nbytes.size) if unseen_frees is None else np.r_[unseen_frees[1:], 0]

    def per_step(values: np.ndarray) -> np.ndarray:
        total = np.r_[0, np.cumsum(values)]
        return total[hi] - total[lo]

    alloc_step = _step_of_position(blocks.alloc, lo, hi)
    free_step = np.where(blocks.free >= 0, _step_of_position(np.maximum(blocks.free, 0), lo, hi), -1)
    temporary = (alloc_step >= 0) & (alloc_step == free_step)
    sizes = memory.nbytes[blocks.alloc]
    churn = temporary & ~autograd[blocks.alloc] & ~autograd[np.maximum(blocks.free, 0)]
    return StepTraffic(
        at_start=before[lo], at_end=before[hi], alloc_bytes=per_step(positive), alloc_count=per_step(memory.nbytes > 0),
        free_bytes=per_step(negative + unseen), free_count=per_step((memory.nbytes < 0).astype(np.int64) + (unseen > 0)),
        temporary_bytes=np.bincount(alloc_step[temporary], weights=sizes[temporary], minlength=n)[:n],
        churn_bytes=np.bincount(alloc_step[churn], weights=sizes[churn], minlength=n)[:n],
        churn_codes=site_codes[churn], churn_block_bytes=sizes[churn],
    )  # fmt: skip


def _step_of_position(position: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The step whose position range [lo, hi) holds each event position (-1: none)."""
    step = np.searchsorted(lo, position, side="right") - 1
    inside = (step >= 0) & (position < hi[np.maximum(step, 0)])
    return np.where(inside, step, -1)


def growth(traffic: StepTraffic, first: int = 0) -> MemoryGrowth:
    """The allocated total at the step boundaries (each step's start from step `first` on, and the last
    one's end) as a line."""
    return line(np.r_[traffic.at_start[first:], traffic.at_end[-1:]])


def line(values: np.ndarray) -> MemoryGrowth:
    """Values at successive step boundaries as a line (see the module docstring)."""
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if n < 3:
        return MemoryGrowth(boundaries=int(n))
    i, j = np.triu_indices(n, k=1)
    slopes = np.sort((values[j] - values[i]) / (j - i))
    spread = CONFIDENCE_Z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    low = int(np.clip(math.floor((slopes.size - spread) / 2.0), 0, slopes.size - 1))
    high = int(np.clip(math.ceil((slopes.size + spread) / 2.0), 0, slopes.size - 1))
    x = np.arange(n, dtype=np.float64)
    fit = np.polyfit(x, values, 1)
    residual = float(((values - np.polyval(fit, x)) ** 2).sum())
    total = float(((values - values.mean()) ** 2).sum())
    return MemoryGrowth(
        bytes_per_step=median(slopes),  # arrays.median: np.median imports numpy.ma (~15 ms) on first use
        low_bytes_per_step=float(slopes[low]),
        high_bytes_per_step=float(slopes[high]),
        r2=1.0 - residual / total if total > 0 else 0.0,
        boundaries=int(n),
    )


def surviving(memory: DeviceMemory, blocks: Blocks, steps: StepWindows) -> np.ndarray:
    """Per block: allocated in a step before the last and still alive at the end of the last step (what
    a leak keeps); none with fewer than two steps."""
    if len(steps) < 2:
        return np.zeros(blocks.alloc.size, dtype=bool)
    last_start = np.searchsorted(memory.ts_us, steps.start_us[-1], side="left")
    end = np.searchsorted(memory.ts_us, steps.end_us[-1], side="left")
    first = np.searchsorted(memory.ts_us, steps.start_us[0], side="left")
    return (blocks.alloc >= first) & (blocks.alloc < last_start) & ((blocks.free < 0) | (blocks.free >= end))


def surviving_sites(memory: DeviceMemory, blocks: Blocks, kept: np.ndarray, steps: StepWindows, site_codes: np.ndarray, names: list[str]) -> dict[str, int]:
    """Bytes per step, by call site, of the blocks `kept` (of `surviving`), largest first."""
    if len(steps) < 2 or not kept.any():
        return {}
    return by_site(site_codes[kept], memory.nbytes[blocks.alloc[kept]], names, 1.0 / (len(steps) - 1))


def by_site(codes: np.ndarray, sizes: np.ndarray, names: list[str], scale: float = 1.0, top: int = 8) -> dict[str, int]:
    """Bytes per name code (times `scale`), largest `top` first; code 0 (unknown) as UNKNOWN_SITE."""
    if codes.size == 0:
        return {}
    totals = np.bincount(codes, weights=sizes.astype(np.float64), minlength=len(names))
    order = np.argsort(-totals, kind="stable")[:top]
    return {(names[c] or UNKNOWN_SITE): int(round(totals[c] * scale)) for c in order.tolist() if totals[c] > 0}
