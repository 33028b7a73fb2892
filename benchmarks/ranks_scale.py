"""Across-ranks analysis at 64 and 1,024 ranks: wall time and peak memory, local pool vs Dask cluster.

Each rank is a small synthetic CPU trace (about 25 KB: 6 steps of data loading, forward and backward ops,
an optimizer range and a gloo all-reduce on a worker thread; rank 7 is 20 ms late in its forward every
step), as `torchscope run` writes them for a gloo DDP job. For each rank count and engine, one fresh
process runs `torchscope.analyze` (no caches) and reports its wall time, its own peak RSS (the reduce,
which holds every rank's extract) and the largest peak RSS of its worker processes (RUSAGE_CHILDREN:
pool workers, or Dask's nannies and workers). A worker extracts one rank at a time, so its peak should not
grow with the rank count; the main process's grows with the extracts it gathers.

    python benchmarks/ranks_scale.py                       # 64 and 1,024 ranks, both engines, 2 workers
    python benchmarks/ranks_scale.py --ranks 64 --engines local

Figures from a loaded 2-core machine are noisy: run it twice and compare (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[1]
STEPS = 6
STEP_US = 100_000.0
SLOW_RANK, SLOW_US = 7, 20_000.0


def rank_trace(rank: int, world: int) -> dict[str, Any]:
    """One rank's trace: steps with phases, ops inside them, and an all-reduce per step."""
    events: list[dict[str, Any]] = []
    late = SLOW_US if rank == SLOW_RANK else 0.0

    def x(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 100 + rank, "tid": tid, "ts": ts, "dur": dur, "args": {}})

    for s in range(STEPS):
        t0 = 1_000_000.0 + s * (STEP_US + SLOW_US)
        x(f"ProfilerStep#{s + 2}", "user_annotation", t0, STEP_US + SLOW_US - 10)
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", t0 + 10, 2_000)
        forward = 30_000.0 + late
        x("torchscope:forward", "user_annotation", t0 + 2_100, forward)
        for i in range(20):
            x("aten::mm", "cpu_op", t0 + 2_200 + i * 1_400, 1_200)
        x("slow_layer" if rank == SLOW_RANK else "aten::relu", "cpu_op", t0 + 30_300, late or 100)
        backward_start = t0 + 2_200 + forward
        x("torchscope:backward", "user_annotation", backward_start, 60_000 - late)
        for i in range(20):
            x("autograd::engine::evaluate_function: MmBackward0", "cpu_op", backward_start + 100 + i * 1_400, 1_200)
        # The all-reduce starts when this rank's gradients are ready and ends when the last rank's are.
        ready = t0 + 2_200 + forward + 28_500
        end = t0 + 2_200 + 30_000 + SLOW_US + 28_500 + 3_000
        x("gloo:all_reduce", "user_annotation", ready, end - ready, tid=2)
        x("torchscope:optimizer", "user_annotation", backward_start + 60_000 - late + 100, 5_000)
    header = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}}
    return {**header, "traceEvents": events}


def write_ranks(folder: Path, world: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        (folder / f"node{rank // 8}_rank{rank}.1796000000000.pt.trace.json").write_text(json.dumps(rank_trace(rank, world)))


def measure_one(folder: Path, engine: str, workers: int) -> dict[str, Any]:
    """Runs in the child process: analyse `folder` once, and report time and peak memory."""
    from torchscope.pipeline.analyze import analyze

    started = time.perf_counter()
    report = analyze(folder, jobs=workers, use_cache=False, cluster="local" if engine == "dask" else None)
    wall = time.perf_counter() - started
    straggler = report.distributed.straggler
    return {
        "wall_s": round(wall, 2),
        "main_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "worker_peak_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
        "straggler": straggler.rank if straggler else None,
        "late_phase": straggler.late_phase if straggler else None,
        "ranks": len(report.distributed.ranks),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--engines", nargs="+", choices=("local", "dask"), default=["local", "dask"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("FOLDER", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(Path(args.one[0]), args.one[1], args.workers)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for world in args.ranks:
            folder = Path(tmp) / f"ranks{world}"
            write_ranks(folder, world)
            for engine in args.engines:
                command = [sys.executable, __file__, "--one", str(folder), engine, "--workers", str(args.workers)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
                if done.returncode != 0:
                    print(f"{world} ranks, {engine}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                    return 1
                result = json.loads(done.stdout.strip().splitlines()[-1])
                print(json.dumps({"ranks": world, "engine": engine, "workers": args.workers, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
