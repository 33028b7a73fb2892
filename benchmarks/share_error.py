"""How far the shares torchscope reports are from the script's own unprofiled timing, on the bundled demo and
examples/bottlenecks/slow_getitem.py (docs/capture.md, "Measured error on the examples").

    .venv/bin/python benchmarks/share_error.py [--runs 2] [--only demo]

Neither script times itself, so a bootstrap times it without any profiler, as tests/integration/
test_shares.py's script times itself: per step (between consecutive ``optimizer.step()`` ends) the
DataLoader fetch (``_BaseDataLoaderIter.__next__``, outermost), ``backward()`` and the optimizer
(``step`` and ``zero_grad``, which torchscope counts with it); forward + "other" is the rest of the step.
The reference is each phase's median share over the timed steps of ``--runs`` plain runs before and after
one ``torchscope run`` (data loading: the median of fetch over step; the compute phases split the rest by
their median times, the statistic the report uses). Not a test: its answer depends on the machine's load,
which it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from advice_check import RUN_TARGET  # benchmarks/ (this script's folder) is on sys.path

REPO = Path(__file__).resolve().parents[1]
SKIP_STEPS = 2  # step 0 and 1 pay one-time costs (as the capture's clock leaves step 0 out)
EXAMPLES: dict[str, list[str]] = {
    "demo": ["-m", "torchscope.examples.demo_train", "--steps", "40"],
    "slow_getitem": [str(REPO / "examples" / "bottlenecks" / "slow_getitem.py")],
}
PHASES = ("data_loading", "forward+other", "backward", "optimizer")

BOOTSTRAP = r"""
import atexit, functools, json, os, runpy, sys, time
import torch
from torch.utils.data import dataloader
from torch.optim.optimizer import Optimizer, register_optimizer_step_pre_hook, register_optimizer_step_post_hook
parent, acc, steps, state = os.getpid(), {"fetch": 0.0, "backward": 0.0, "optimizer": 0.0}, [], {"last": None, "in": False}
def timed(key, original):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if state["in"]:
            return original(*args, **kwargs)
        state["in"], started = True, time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            acc[key] += time.perf_counter() - started
            state["in"] = False
    return wrapper
dataloader._BaseDataLoaderIter.__next__ = timed("fetch", dataloader._BaseDataLoaderIter.__next__)
torch.Tensor.backward = timed("backward", torch.Tensor.backward)
torch.autograd.backward = timed("backward", torch.autograd.backward)
Optimizer.zero_grad = timed("optimizer", Optimizer.zero_grad)
def pre(*a):
    state["opt"] = time.perf_counter()
def post(*a):
    now = time.perf_counter()
    acc["optimizer"] += now - state.pop("opt", now)
    if state["last"] is not None:
        steps.append([now - state["last"], acc["fetch"], acc["backward"], acc["optimizer"]])
    state["last"] = now
    for key in acc:
        acc[key] = 0.0
register_optimizer_step_pre_hook(pre)
register_optimizer_step_post_hook(post)
atexit.register(lambda: os.getpid() == parent and json.dump(steps, open(os.environ["SHARE_OUT"], "w")))
""" + RUN_TARGET


def own_timer(name: str) -> list[list[float]]:
    """Per step (total, fetch, backward, optimizer) in s, of one unprofiled run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        subprocess.run([sys.executable, "-c", BOOTSTRAP, *EXAMPLES[name]], env=dict(os.environ, SHARE_OUT=str(out)),
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())[SKIP_STEPS - 1:]  # the first entry is step 1 (step 0 has no start)


def reference(steps: list[list[float]]) -> dict[str, float]:
    data = 100.0 * statistics.median(fetch / total for total, fetch, _, _ in steps)
    phases = {
        "forward+other": statistics.median(max(t - f - b - o, 0.0) for t, f, b, o in steps),
        "backward": statistics.median(b for _, _, b, _ in steps),
        "optimizer": statistics.median(o for _, _, _, o in steps),
    }
    total = sum(phases.values())
    return {"data_loading": data} | {k: (100.0 - data) * v / total for k, v in phases.items()}


def reported(name: str) -> tuple[dict[str, float], dict[str, float], str]:
    """(corrected, recorded) shares and the correction's method, from one `torchscope run`."""
    import torchscope

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "torchscope", "run", "--out", str(run_dir), "--no-report",
                        *EXAMPLES[name]], cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report = torchscope.analyze(run_dir, jobs=1, use_cache=False)
    overhead = report.measurements.profiler_overhead
    corrected = dict(overhead.corrected_percent)
    recorded = {n: p.percent for n, p in report.phases.items()}

    def fold(shares: dict[str, float]) -> dict[str, float]:
        return {"data_loading": shares.get("data_loading", 0.0),
                "forward+other": shares.get("forward", 0.0) + shares.get("other", 0.0),
                "backward": shares.get("backward", 0.0), "optimizer": shares.get("optimizer", 0.0)}

    return fold(corrected), fold(recorded), overhead.method


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="plain runs before and after the capture (each)")
    parser.add_argument("--only", choices=sorted(EXAMPLES))
    args = parser.parse_args()
    for name in [args.only] if args.only else list(EXAMPLES):
        start = load()
        steps = [s for _ in range(args.runs) for s in own_timer(name)]
        corrected, recorded, method = reported(name)
        steps += [s for _ in range(args.runs) for s in own_timer(name)]
        ref = reference(steps)
        print(f"{name} (load {start} -> {load()}, {len(steps)} timed steps, method {method})")
        print(f"  {'phase':<15}{'own timer':>10}{'corrected':>11}{'error pp':>10}{'recorded':>10}")
        for phase in PHASES:
            print(f"  {phase:<15}{ref[phase]:>10.1f}{corrected[phase]:>11.1f}{corrected[phase] - ref[phase]:>+10.1f}"
                  f"{recorded[phase]:>10.1f}")


if __name__ == "__main__":
    main()
