"""False-alarm rate of the regression gate at its defaults: N identical runs of
examples/ci/train_step_time.py, every ordered pair diffed, the share of pairs whose gate fails.

    .venv/bin/python benchmarks/gate_false_alarms.py [--runs 8] [--steps 10] [--run-noise 4]

Prints a markdown table (the figures in docs/ci.md come from it). Not a test: it takes minutes and its
answer depends on how busy the machine is, which the table states (load average before and after).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchscope.pipeline.diff import diff_paths  # noqa: E402
from torchscope.pipeline.gate import DEFAULT_SLOWER_PCT, evaluate  # noqa: E402
from torchscope.pipeline.noise import DEFAULT_RUN_NOISE_PCT  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--run-noise", type=float, default=DEFAULT_RUN_NOISE_PCT, help="percent (the gate's --run-noise)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for i in range(args.runs):
            out = Path(tmp) / f"run{i}"
            subprocess.run([sys.executable, str(REPO / "examples" / "ci" / "train_step_time.py"), "--out", str(out),
                            "--steps", str(args.steps)], check=True, capture_output=True)
            runs.append(out)
        pairs = list(itertools.permutations(runs, 2))
        diffs = [diff_paths(a, b, jobs=1, run_noise_pct=args.run_noise) for a, b in pairs]
    alarms = sum(evaluate(d, DEFAULT_SLOWER_PCT, []).failed for d in diffs)
    significant = sum(d.step_time.significant for d in diffs)
    worst = max(abs(d.step_time.change_pct) for d in diffs)
    print("| runs | steps each | run noise | ordered pairs | beyond noise | gate failed (5 %) | largest change | load avg before/after |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {args.runs} | {args.steps} | {args.run_noise:g} % | {len(pairs)} | {significant} | {alarms} "
          f"({100 * alarms / len(pairs):.1f} %) | {worst:.1f} % | {load_before:.1f} / {os.getloadavg()[0]:.1f} |")


if __name__ == "__main__":
    main()
