"""The straggler's `late_phase` for the phases the real-run tests do not plant (outside the step's phases,
backward, optimizer), on synthetic 3-rank gloo traces (tests/helpers/trace_builder.py) read through the
whole pipeline: one rank spends 30 ms more per step in one place, in a Python frame of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.pipeline.analyze import analyze

RANKS, STEPS, EXTRA_US, SLOW = 3, 5, 30_000.0, 1
CULPRIT = {"outside_step": "train.py(20): log_metrics", "backward": "train.py(31): clip_per_sample",
           "optimizer": "train.py(42): ema_update"}


def write_run(folder: Path, where: str) -> Path:
    """Each rank: data loading, [outside work], forward, backward; its all-reduce (gloo's thread) starts when
    its backward ends and ends when the last rank's does (+2 ms transfer); then its optimizer."""
    builders = [TraceBuilder() for _ in range(RANKS)]
    for rank, b in enumerate(builders):
        b.header["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": RANKS}
    cursor = [1_000_000.0] * RANKS
    for s in range(STEPS):
        ready, starts = [], list(cursor)
        for rank, b in enumerate(builders):
            extra = {w: (EXTRA_US if rank == SLOW and where == w else 0.0) for w in CULPRIT}
            t = starts[rank] + 10
            b.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 2_000)
            t += 2_100
            if extra["outside_step"]:
                b.op(CULPRIT["outside_step"], t, extra["outside_step"], cat="python_function")
                t += extra["outside_step"] + 50
            b.annotation("torchscope:forward", t, 30_000)
            for i in range(10):
                b.op("aten::mm", t + 100 + i * 2_500, 2_000)
            t += 30_100
            backward = 40_000 + extra["backward"]
            b.annotation("torchscope:backward", t, backward)
            for i in range(10):
                b.op("autograd::engine::evaluate_function: MmBackward0", t + 100 + i * 3_500, 3_000)
            if extra["backward"]:
                b.op(CULPRIT["backward"], t + 36_000, extra["backward"], cat="python_function")
            ready.append(t + backward)
        end = max(ready) + 2_000
        for rank, b in enumerate(builders):
            b.op("gloo:all_reduce", ready[rank], end - ready[rank], cat="user_annotation", tid=2)
            optimizer = 5_000 + (EXTRA_US if rank == SLOW and where == "optimizer" else 0.0)
            b.annotation("torchscope:optimizer", end + 100, optimizer)
            if optimizer > 5_000:
                b.op(CULPRIT["optimizer"], end + 200, EXTRA_US, cat="python_function")
            step_end = end + 100 + optimizer + 50
            b.step(s + 2, starts[rank], step_end - starts[rank])
            cursor[rank] = step_end + 10
    for rank, b in enumerate(builders):
        b.write(folder / f"node0_rank{rank}.1796000000000.pt.trace.json")
    return folder


@pytest.mark.parametrize("where", ["outside_step", "backward", "optimizer"])
def test_late_phase_and_culprit(tmp_path: Path, where: str) -> None:
    report = analyze(write_run(tmp_path, where), jobs=1, use_cache=False)
    late = report.distributed.straggler
    assert late is not None and late.rank == SLOW
    assert late.late_phase == where
    assert late.phase_excess_us_per_step[where] == pytest.approx(EXTRA_US, rel=0.05)
    assert next(iter(late.culprits_us_per_step)).startswith(CULPRIT[where].split(": ")[1])  # "log_metrics (train.py:20)"
    [finding] = [f for f in report.findings if f.category == "straggler"]
    assert finding.evidence["straggler_rank"] == SLOW and finding.evidence["late_phase"] == where


def test_balanced_ranks_have_no_late_phase(tmp_path: Path) -> None:
    report = analyze(write_run(tmp_path, "none"), jobs=1, use_cache=False)
    assert report.distributed.present and report.distributed.straggler is None
