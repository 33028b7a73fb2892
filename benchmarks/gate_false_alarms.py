"""False-alarm rate of the regression gate for several run-to-run noise floors, all on the SAME runs: N
identical runs of examples/ci/train_step_time.py, every ordered pair diffed under each `--run-noise`
value, the share of pairs whose gate (5 %) fails; and, as the price of a wider floor, how many of the
N pairs (identical run -> a run with a planted regression of `--planted` %) each floor still catches.

    .venv/bin/python benchmarks/gate_false_alarms.py [--runs 8] [--steps 10] [--run-noise 2 3 4 5] [--planted 20]

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

from torchscope.pipeline.diff import diff_reports, load_report  # noqa: E402
from torchscope.pipeline.gate import DEFAULT_SLOWER_PCT, evaluate  # noqa: E402
from torchscope.pipeline.noise import DEFAULT_RUN_NOISE_PCT  # noqa: E402
from torchscope.report.model import Report  # noqa: E402

EXAMPLE = REPO / "examples" / "ci" / "train_step_time.py"


def _run(out: Path, steps: int, extra_ms: float = 0.0) -> Report:
    subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out), "--steps", str(steps), "--extra-ms", f"{extra_ms:.3f}"],
                   check=True, capture_output=True)
    return load_report(out, jobs=1, use_cache=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--run-noise", type=float, nargs="+", default=sorted({2.0, 3.0, DEFAULT_RUN_NOISE_PCT, 5.0}),
                        help="percent (the gate's --run-noise); each value is judged on the same runs")
    parser.add_argument("--planted", type=float, default=20.0, help="percent slower for the detection column (0: none)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        reports = [_run(Path(tmp) / f"run{i}", args.steps) for i in range(args.runs)]
        base_ms = sum(r.mean_step_us for r in reports) / len(reports) / 1000
        planted = _run(Path(tmp) / "planted", args.steps, args.planted / 100 * base_ms) if args.planted else None
    load_after = os.getloadavg()[0]
    pairs = list(itertools.permutations(reports, 2))
    worst = max(abs(diff_reports(a, b).step_time.change_pct) for a, b in pairs)
    print(f"{args.runs} identical runs of {args.steps} steps, {len(pairs)} ordered pairs, largest change between "
          f"identical runs {worst:.1f} %, load average {load_before:.1f} before / {load_after:.1f} after")
    if planted is not None:
        caught = [diff_reports(r, planted).step_time.change_pct for r in reports]
        print(f"planted regression: {args.planted:g} % of the mean step ({min(caught):.1f} to {max(caught):.1f} % measured)")
    print()
    print("| `--run-noise` | pairs beyond noise | gate failed (5 %) | of which flagged busy | planted regression caught |")
    print("|---|---|---|---|---|")
    for floor in args.run_noise:
        diffs = [diff_reports(a, b, run_noise_pct=floor) for a, b in pairs]
        gates = [evaluate(d, DEFAULT_SLOWER_PCT, []) for d in diffs]
        alarms = sum(g.failed for g in gates)
        flagged = sum(g.failed and "captured on a busy machine" in g.explanation for g in gates)
        significant = sum(d.step_time.significant for d in diffs)
        detected = "-"
        if planted is not None:
            hits = sum(evaluate(diff_reports(r, planted, run_noise_pct=floor), DEFAULT_SLOWER_PCT, []).failed for r in reports)
            detected = f"{hits} of {len(reports)}"
        print(f"| {floor:g} %{' (default)' if floor == DEFAULT_RUN_NOISE_PCT else ''} | {significant} | {alarms} "
              f"({100 * alarms / len(pairs):.1f} %) | {flagged} | {detected} |")


if __name__ == "__main__":
    main()
