"""`torchscope diff BASE NEW`: what got faster or slower between two runs, beyond noise; with
`--fail-if-slower` / `--fail-on`, a regression gate for CI (exit 1 on a regression, 2 on bad input)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from torchscope.cli.width import add_width_option, report_width
from torchscope.errors import InputError

DIFF_FORMATS = ("terminal", "json", "html")


def add_gate_options(parser: argparse.ArgumentParser, default_slower: str | None) -> None:
    group = parser.add_argument_group("regression gate (exit 1 when a change is beyond noise and threshold)")
    group.add_argument("--fail-if-slower", metavar="PCT", default=default_slower,
                       help="mean step time up by more than PCT, e.g. 5%%" + (f" (default {default_slower})".replace("%", "%%") if default_slower else ""))
    group.add_argument("--run-noise", metavar="PCT", default="4%",
                       help="how much a run's mean step time varies from run to run on its own, beyond what its "
                       "steps show (default 4%%, docs/ci.md); widens every interval")
    group.add_argument("--fail-on", metavar="SPEC", action="append", default=[],
                       help="METRIC+X%% (a report metric worse by X %%) or CATEGORY+Xpp (its share of the step up by X points); repeatable")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=DIFF_FORMATS, default="terminal")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the diff to FILE instead of stdout")
    add_width_option(parser)
    parser.add_argument("--jobs", type=int, default=None, help="analysis workers for run directories and traces")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the caches")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("diff", help="compare two runs: what changed beyond noise",
                                   description="Compare two runs (run directories, traces or saved JSON reports).")
    parser.add_argument("base", metavar="BASE", help="the baseline: run directory, trace file or report JSON")
    parser.add_argument("new", metavar="NEW", help="the run to compare with it")
    add_output_options(parser)
    add_gate_options(parser, default_slower=None)
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    return run_diff(args, args.base, args.new)


def run_diff(args: argparse.Namespace, base: str, new: str) -> int:
    """Diff, gate, write; exit 1 when the gate fails."""
    from torchscope.pipeline import gate
    from torchscope.pipeline.diff import diff_paths

    slower = gate.parse_percent(args.fail_if_slower) if args.fail_if_slower else None
    thresholds = [gate.parse_threshold(spec) for spec in args.fail_on]
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    run_noise = gate.parse_percent(args.run_noise)
    diff = diff_paths(base, new, jobs=args.jobs, use_cache=not args.no_cache, run_noise_pct=run_noise)
    if slower is not None or thresholds:
        diff.gate = gate.evaluate(diff, slower, thresholds)
    _write(args, _render(args, diff))
    return 1 if diff.gate is not None and diff.gate.failed else 0


def _render(args: argparse.Namespace, diff: Any) -> str:
    if args.format == "json":
        import msgspec

        return msgspec.json.format(msgspec.json.encode(diff), indent=2).decode()
    if args.format == "html":
        from torchscope.render.diff_html import render_diff_html

        return render_diff_html(diff)
    from torchscope.render.diff_terminal import render_diff_terminal

    color = args.output is None and sys.stdout.isatty()
    return render_diff_terminal(diff, width=report_width(args.width, None if args.output else sys.stdout), color=color)


def _write(args: argparse.Namespace, text: str) -> None:
    text = text if text.endswith("\n") else text + "\n"
    if not args.output:
        sys.stdout.write(text)
        return
    from torchscope.files import write_atomic

    try:
        write_atomic(Path(args.output), text.encode("utf-8"))
    except OSError as exc:
        raise InputError(f"{args.output}: cannot write the diff ({exc.strerror or exc})") from None
