"""Is the data-loading advice right on this machine? Capture, read the advice, apply it, measure.

    .venv/bin/python benchmarks/advice_check.py [--runs 3] [--steps 30] [--only demo]

For the bundled demo (``torchscope.examples.demo_train``) and ``examples/bottlenecks/slow_getitem.py``:

1. ``torchscope run`` the script as written and read the ``data_loading.exposed`` finding's fixes
   (``num_workers``, and ``torch.set_num_threads`` where the advice trades intra-op threads for a worker);
2. time the script without any profiler, as written and with the advice applied, ``--runs`` times each,
   alternating: the median time between consecutive ``optimizer.step()`` calls after the first
   ``SKIP_STEPS`` steps (worker start-up and one-time costs left out);
3. print the advice and the measured change. The advice is confirmed when the advised run is not slower
   beyond the noise (``NOISE``), and, where the advice promises a saving, faster.

The advice is applied without editing the script (as ``tune`` would): a bootstrap overrides the
DataLoader's keywords named by the fixes and the intra-op threads, then runs the script as ``python``
would. Not a test: it takes a few minutes and its answer depends on the machine (docs/performance.md
records what it printed here).
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SKIP_STEPS = 4
NOISE = 0.05  # step-time medians of identical runs differ by up to ~5 % on the shared 2-core machine

# name -> (command after `python`, the steps argument the timing runs get)
EXAMPLES: dict[str, list[str]] = {
    "demo": ["-m", "torchscope.examples.demo_train", "--steps", "{steps}"],
    "slow_getitem": [str(REPO / "examples" / "bottlenecks" / "slow_getitem.py")],
}

# The end of every bootstrap here: run the target (a script, or `-m module`) as `python` would.
RUN_TARGET = r"""
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""

# The child: override the DataLoader keywords and the threads, time the optimizer steps, run the target.
BOOTSTRAP = r"""
import atexit, json, os, runpy, sys, time
import torch
from torch.utils.data import DataLoader
overrides = json.loads(os.environ["ADVICE_OVERRIDES"])
threads = overrides.pop("torch.set_num_threads", None)
if threads:
    torch.set_num_threads(int(threads))
original_init = DataLoader.__init__
def __init__(self, *args, **kwargs):
    kwargs.update({k: v for k, v in overrides.items() if k in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory")})
    if not kwargs.get("num_workers"):
        kwargs.pop("persistent_workers", None); kwargs.pop("prefetch_factor", None)
    original_init(self, *args, **kwargs)
DataLoader.__init__ = __init__
from torch.optim.optimizer import register_optimizer_step_post_hook
stamps, parent = [], os.getpid()
register_optimizer_step_post_hook(lambda *a: stamps.append(time.perf_counter()))
atexit.register(lambda: os.getpid() == parent and json.dump(stamps, open(os.environ["ADVICE_OUT"], "w")))
""" + RUN_TARGET


def _command(name: str, steps: int) -> list[str]:
    return [part.format(steps=steps) for part in EXAMPLES[name]]


def step_time(name: str, overrides: dict[str, Any], steps: int) -> float:
    """Median step time (s) of one unprofiled run of example `name` with `overrides` applied."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stamps.json"
        env = dict(os.environ, ADVICE_OVERRIDES=json.dumps(overrides), ADVICE_OUT=str(out))
        subprocess.run([sys.executable, "-c", BOOTSTRAP, *_command(name, steps)], env=env, cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
        stamps = json.loads(out.read_text())
    gaps = [b - a for a, b in zip(stamps[SKIP_STEPS:], stamps[SKIP_STEPS + 1:])]
    if not gaps:
        raise SystemExit(f"{name}: too few steps to time ({len(stamps)})")
    return statistics.median(gaps)


def advice(name: str, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the overrides the data-loading finding advises, the finding as JSON) from a `torchscope run`."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "torchscope", "run", "--out", str(run_dir), "--no-report",
                        *_command(name, steps)], cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-m", "torchscope", "analyze", str(run_dir), "--format", "json", "-o",
                        str(report_path), "--no-cache"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        report = json.loads(report_path.read_text())
    finding = next((f for f in report["findings"] if f["id"] == "data_loading.exposed"), None)
    if finding is None:
        return {}, {}
    overrides = {fix["target"]: fix["value"] for fix in finding["fixes"]
                 if fix["value"] is not None and fix["kind"] in ("dataloader_kwarg", "torch_flag")}
    return overrides, finding


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--only", choices=sorted(EXAMPLES))
    parser.add_argument("--overrides", help="JSON: measure these instead of the captured advice")
    args = parser.parse_args()
    for name in [args.only] if args.only else list(EXAMPLES):
        if args.overrides:
            overrides, finding = json.loads(args.overrides), {"title": "(given)", "recommendation": ""}
        else:
            overrides, finding = advice(name, args.steps)
        print(f"## {name}\nfinding: {finding.get('title', '(none)')}\nadvice: {finding.get('recommendation', '')}")
        print(f"applied: {overrides or '(nothing to apply)'}")
        if not overrides:
            continue
        base, advised = [], []
        for _ in range(args.runs):  # alternate, so that a load change hits both alike
            base.append(step_time(name, {}, args.steps))
            advised.append(step_time(name, overrides, args.steps))
        b, a = statistics.median(base), statistics.median(advised)
        change = (a - b) / b
        verdict = "confirmed" if change <= NOISE and (change < -NOISE or finding.get("time_share") in (None, 0)) else (
            "not confirmed")
        print(f"step: {1e3 * b:.1f} ms as written -> {1e3 * a:.1f} ms advised ({100 * change:+.1f} %), "
              f"runs {[round(1e3 * x, 1) for x in base]} vs {[round(1e3 * x, 1) for x in advised]}: {verdict}\n")


if __name__ == "__main__":
    main()
