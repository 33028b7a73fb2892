"""`torchscope check RUN --baseline REPORT`: the common CI case of `diff`, against a stored baseline
report, with the gate on by default (`--fail-if-slower 5%`); exit 1 on a regression."""

from __future__ import annotations

import argparse
from typing import Any

from torchscope.cli.diff import add_gate_options, add_output_options, run_diff
from torchscope.pipeline.gate import DEFAULT_SLOWER_PCT


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("check", help="fail (exit 1) when a run regressed against a baseline report",
                                   description="Compare RUN with a stored baseline and gate on regressions.")
    parser.add_argument("run", metavar="RUN", help="run directory, trace file or report JSON to check")
    parser.add_argument("--baseline", metavar="REPORT", required=True,
                        help="the baseline: a saved report JSON (e.g. the report.json of a good run), or a run")
    add_output_options(parser)
    add_gate_options(parser, default_slower=f"{DEFAULT_SLOWER_PCT:g}%")
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    return run_diff(args, args.baseline, args.run)
