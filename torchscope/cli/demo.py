"""``torchscope demo [--out DIR]``: profile a bundled small training run with a planted bottleneck.

The workload (:mod:`torchscope.examples.demo_train`: synthetic images, heavy per-sample preprocessing,
``num_workers=0``) runs through the same machinery as ``torchscope run``; then the diagnosis is printed
on stdout, ``report.json`` is written into the run directory and its path is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from torchscope.cli.run import add_out_option, present, print_script_ending
from torchscope.cli.width import add_width_option, report_width
from torchscope.rundir.config import CaptureConfig
from torchscope.rundir.layout import REPORT_NAME

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
    if outcome.exit_code == 0 and outcome.profiler.run_dir is not None:
        print(f"torchscope demo: {advised_hint(outcome.profiler.run_dir / REPORT_NAME)}", file=sys.stderr)
    return outcome.exit_code


def advised_hint(report_path: Path) -> str:
    """What to try next, from the data-loading finding the demo just wrote: its workers (and threads) where
    it advises them, else its other fix (a cheaper ``__getitem__``, on a machine where workers do not pay)."""
    try:
        findings = json.loads(report_path.read_text()).get("findings") or []
    except (OSError, ValueError, AttributeError):
        findings = []
    finding = next((f for f in findings if isinstance(f, dict) and f.get("id") == "data_loading.exposed"), None)
    if finding is None:
        return f"see the report in {report_path.parent}"
    values = {fix.get("target"): fix.get("value") for fix in finding.get("fixes") or [] if isinstance(fix, dict)}
    if isinstance(values.get("num_workers"), int):
        options = f"--num-workers {values['num_workers']}"
        if isinstance(values.get("torch.set_num_threads"), int):
            options += f" --threads {values['torch.set_num_threads']}"
        return f"try the advised fix with `torchscope run -m {DEMO_MODULE} {options}`"
    return ("on this machine the finding advises a cheaper __getitem__, not workers (its recommendation says "
            "why); the planted work is in torchscope/examples/demo_train.py")
