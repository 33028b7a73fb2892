"""One trial of `torchscope tune`: run the user's script under the profiler with some fixes applied.

    python -m torchscope.capture.trial --fixes FIXES.json --out DIR --active N (script.py | -m module) [args]

Runs in its own process (a fix must not leak into the next trial) and stops once the active steps are
captured. Exit status: the script's (0 also when the capture stopped it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import msgspec

from torchscope.capture.interventions import applied
from torchscope.capture.runner import Target, run_target
from torchscope.report.model import Fix
from torchscope.rundir.config import CaptureConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchscope.capture.trial")
    parser.add_argument("--fixes", type=Path, required=True, help="JSON list of fixes to apply")
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=5)
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    fixes = msgspec.json.decode(args.fixes.read_bytes(), type=list[Fix])
    target = Target("module", args.module[0], tuple(args.module[1:])) if args.module else Target("script", args.target[0], tuple(args.target[1:]))
    # Timing, not culprits: no stacks, shapes or memory events (they slow Python-heavy steps unevenly).
    config = CaptureConfig(out=args.out, wait=1, warmup=args.warmup, active=args.active, record_shapes=False,
                           profile_memory=False, with_stack=False, with_flops=False, stop_after_active=True)
    with applied(fixes):
        outcome = run_target(target, config)
    if outcome.exception is not None:
        print(f"trial failed: {type(outcome.exception).__name__}: {outcome.exception}", file=sys.stderr)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
