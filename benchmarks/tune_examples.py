"""How long `torchscope tune` takes on each CPU example, how many trials it ran, and what it found.

    .venv/bin/python benchmarks/tune_examples.py [--budget 600] [script.py ...]

Runs `torchscope tune --format json` on each script of examples/bottlenecks (or the ones given), one
after the other, and prints a markdown table: wall time, trials, baseline step time and run-to-run
noise, the best candidate with its speed-up and 95 % interval, and each candidate's predicted vs
measured saving. docs/performance.md and docs/tune.md hold one. Not a test: it takes minutes and its
figures depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "bottlenecks"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", type=Path, help="default: every examples/bottlenecks/*.py")
    parser.add_argument("--budget", default="600", help="tune --budget (seconds)")
    args = parser.parse_args()
    scripts = args.scripts or sorted(EXAMPLES.glob("*.py"))
    print("| script | tune wall time | trials | baseline step (noise) | best (95 % CI) | predicted vs measured saving |")
    print("|---|---|---|---|---|---|")
    for script in scripts:
        with tempfile.TemporaryDirectory() as cwd:
            began = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "torchscope", "tune", "--format", "json", "--budget", args.budget,
                                   str(script.resolve())], cwd=cwd, capture_output=True, text=True)
            wall = time.monotonic() - began
        if done.returncode != 0:
            print(f"| {script.name} | {wall:.0f} s | - | failed: {done.stderr.strip().splitlines()[-1:]} | | |")
            continue
        result = json.loads(done.stdout)
        rows = [*result["candidates"], *([result["combination"]] if result["combination"] else [])]
        best = max((c for c in rows if c["status"] == "faster"), key=lambda c: c["speedup"], default=None)
        best_text = (f"{best['fix']}: {best['speedup']:.2f}x ({_bound(best['ci_low'])}-{_bound(best['ci_high'])})"
                     if best else "none beyond noise")
        savings = "; ".join(
            f"{c['fix']}: {_pct(c['predicted_saving'])} vs {_pct(c['measured_saving'])} ({c['status']})" for c in rows
        ) or "no applicable fix"
        print(f"| {script.name} | {wall:.0f} s | {result['trials']} | {result['baseline_step_us'] / 1000:.1f} ms "
              f"({result['noise_pct']:.1f} %) | {best_text} | {savings} |", flush=True)
    return 0


def _bound(value: float | None) -> str:
    return "inf" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


if __name__ == "__main__":
    sys.exit(main())
