"""``torchscope tune [options] (script.py | -m module) [args...]``: apply the diagnosis's fixes without
editing the code, one trial each, and report the measured speed-ups (pipeline/tune.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from torchscope.errors import UsageError

FORMATS = ("terminal", "json")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune", help="try the recommended fixes on a script and measure them",
        usage="torchscope tune [options] (script.py | -m module) [args ...]",
        description="Run a baseline trial, then one trial per fix the diagnosis proposes (applied without "
        "editing the code), and report measured speed-ups with their confidence.",
    )
    parser.add_argument("--active", type=int, default=5, help="steps measured per trial (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    parser.add_argument("--budget", type=float, default=600.0, metavar="S", help="no new trial after S seconds (600)")
    parser.add_argument("--in-place", action="store_true",
                        help="run trials in this directory (by default a temporary one, so the script's "
                        "outputs, such as checkpoints, are not written here)")
    parser.add_argument("--format", choices=FORMATS, default="terminal")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="module")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args ...]")
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    from torchscope.capture.runner import Target, check_target
    from torchscope.pipeline.tune import TuneOptions, tune

    if args.module is not None:
        if not args.module:
            raise UsageError("-m needs a module name")
        check_target(Target("module", args.module[0]))
        command = ["-m", *args.module]
    elif args.target:
        check_target(Target("script", args.target[0]))
        command = list(args.target)
    else:
        raise UsageError("nothing to tune: give a script (torchscope tune train.py) or -m module")
    if args.active < 3 or args.warmup < 0:
        raise UsageError("--active must be at least 3 (fewer steps cannot tell a change from noise)")
    result = tune(command, TuneOptions(warmup=args.warmup, active=args.active, budget_s=args.budget, in_place=args.in_place))
    if args.format == "json":
        import msgspec

        sys.stdout.write(msgspec.json.format(msgspec.json.encode(result), indent=2).decode() + "\n")
    else:
        from torchscope.render.tune_terminal import render_tune_terminal

        sys.stdout.write(render_tune_terminal(result))
    return 0
