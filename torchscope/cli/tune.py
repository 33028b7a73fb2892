"""``torchscope tune [options] (script.py | -m module) [args...]``: apply the diagnosis's fixes without
editing the code, one trial each, and report the measured speed-ups (pipeline/tune.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torchscope.cli.width import add_width_option, report_width
from torchscope.errors import InputError, UsageError

FORMATS = ("terminal", "json", "html")
INTERRUPTED_EXIT = 130


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tune", help="try the recommended fixes on a script and measure them",
        usage="torchscope tune [options] (script.py | -m module) [args ...]",
        description="Run a baseline trial, then one trial per fix the diagnosis proposes (applied without "
        "editing the code), then the faster ones together, and report measured speed-ups with their "
        "confidence. Trials run in a temporary directory with TORCHSCOPE_TRIAL=1 set (docs/tune.md).",
    )
    parser.add_argument("--active", type=int, default=5, help="steps measured per trial (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="steps before measuring (default 2)")
    parser.add_argument("--budget", type=float, default=600.0, metavar="S",
                        help="stop trying after S seconds in all (default 600)")
    parser.add_argument("--baselines", type=int, default=3, metavar="N",
                        help="baseline trials; their spread is the run-to-run noise estimate (default 3)")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="P",
                        help="confidence of each speed-up's interval; faster or slower only beyond it (default 0.95)")
    parser.add_argument("--repeats", type=int, default=2, metavar="N",
                        help="trials of one candidate at most: another while the answer is within noise (default 2)")
    parser.add_argument("--loss-tolerance", type=float, default=0.1, metavar="F",
                        help="a trial whose mean loss moves more than F (relative) is not used (default 0.1)")
    parser.add_argument("--try", dest="extra", action="append", default=[], metavar="K=V[,K=V]",
                        help="also try this candidate (e.g. num_workers=4,persistent_workers=True); repeatable")
    parser.add_argument("--only", action="store_true",
                        help="run only the --try candidates (the diagnosis's others are listed as skipped)")
    parser.add_argument("--nproc-per-node", type=int, default=0, metavar="N",
                        help="launch each trial with torchrun --standalone --nproc_per_node=N (a DDP script)")
    parser.add_argument("--in-place", action="store_true",
                        help="run trials in this directory (by default a temporary one, so the script's "
                        "outputs, such as checkpoints, are not written here)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each trial's capture under DIR (open one with torchscope analyze or view)")
    parser.add_argument("--format", choices=FORMATS, default="terminal")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the result to FILE instead of stdout")
    add_width_option(parser)
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="module")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args ...]")
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    from torchscope.capture.runner import Target, check_target
    from torchscope.pipeline.tune import TuneOptions, parse_try, tune

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
        raise UsageError("--active must be at least 3 (fewer steps cannot tell a change from noise), --warmup at least 0")
    if not args.loss_tolerance >= 0 or not args.budget > 0 or args.baselines < 1 or args.nproc_per_node < 0 \
            or args.repeats < 1 or not 0.5 <= args.confidence < 1:
        raise UsageError("--loss-tolerance must be at least 0, --budget above 0, --baselines and --repeats at "
                         "least 1, --nproc-per-node at least 0, --confidence in [0.5, 1)")
    if args.only and not args.extra:
        raise UsageError("--only needs at least one --try candidate")
    width = report_width(args.width, None if args.output else sys.stdout)  # checked before the trials run
    options = TuneOptions(warmup=args.warmup, active=args.active, budget_s=args.budget, in_place=args.in_place,
                          loss_tolerance=args.loss_tolerance, baselines=args.baselines, repeats=args.repeats,
                          confidence=args.confidence,
                          nproc_per_node=args.nproc_per_node, extra=tuple(parse_try(t) for t in args.extra), only=args.only,
                          keep=args.keep.resolve() if args.keep else None)
    result = tune(command, options, progress=lambda line: print(f"torchscope tune: {line}", file=sys.stderr, flush=True))
    _write(args.output, _render(args.format, result, width))
    return INTERRUPTED_EXIT if result.interrupted else 0


def _render(fmt: str, result: Any, width: int) -> str:
    if fmt == "json":
        import msgspec

        return msgspec.json.format(msgspec.json.encode(result), indent=2).decode() + "\n"
    if fmt == "html":
        from torchscope.render.tune_html import render_tune_html

        return render_tune_html(result)
    from torchscope.render.tune_terminal import render_tune_terminal

    return render_tune_terminal(result, width=width)


def _write(output: str | None, text: str) -> None:
    if not output:
        sys.stdout.write(text)
        return
    from torchscope.files import write_atomic

    try:
        write_atomic(Path(output), text.encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{output}: cannot write the result ({exc.strerror or exc})") from None
