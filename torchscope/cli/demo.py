"""``torchscope demo [--out DIR]``: profile a bundled small training run with a planted bottleneck.

The workload (:mod:`torchscope.examples.demo_train`: synthetic images, heavy per-sample preprocessing,
``num_workers=0``) runs through the same machinery as ``torchscope run``; then the diagnosis is printed
on stdout, ``report.json`` is written into the run directory and its path is printed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchscope.cli.run import add_out_option, present, print_script_ending
from torchscope.cli.width import add_width_option, report_width
from torchscope.rundir.config import CaptureConfig

DEMO_MODULE = "torchscope.examples.demo_train"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="profile a bundled training run that has a data-loading bottleneck",
        description="Profile a small bundled CPU training run (synthetic data, nothing downloaded) "
        "whose DataLoader is the bottleneck, and print the diagnosis.",
    )
    add_out_option(parser)
    add_width_option(parser)
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    from torchscope.capture.runner import Target, run_target

    report_width(args.width, None)  # a bad --width fails before the run, not after it

    print(
        f"torchscope demo: profiling `python -m {DEMO_MODULE}` "
        "(a small CNN whose DataLoader does heavy per-sample work with num_workers=0)",
        file=sys.stderr,
    )
    outcome = run_target(Target("module", DEMO_MODULE), CaptureConfig(out=args.out))
    print_script_ending(outcome)
    present(outcome, report=True, stream=sys.stdout, json_report=True, width=args.width)
    if outcome.exit_code == 0 and not outcome.profiler.trace_files:
        # Unlike `run` (where the user's script is what matters), the demo's whole job is the capture.
        print("torchscope: error: the demo captured no trace (see the warning above)", file=sys.stderr)
        return 1
    if outcome.exit_code == 0:
        print(f"torchscope demo: try the fix with `torchscope run -m {DEMO_MODULE} --num-workers 2`",
              file=sys.stderr)
    return outcome.exit_code
