"""`torchscope analyze PATH`: diagnose existing traces (a file, a trace directory or a run directory)."""

from __future__ import annotations

import argparse
import sys

from torchscope.cli.output import check_output_target, write_report
from torchscope.cli.progress import load_progress
from torchscope.cli.width import add_width_option, report_width
from torchscope.errors import InputError
from torchscope.text import one_line

FORMATS = ("terminal", "json", "html")  # registered renderers (torchscope.render); listed here so --help needs no import


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("analyze", help="analyse Kineto traces and print the diagnosis")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace file(s) (.json/.json.gz) or directory")
    parser.add_argument("--format", choices=FORMATS, default="terminal")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    parser.add_argument(
        "--jobs", type=int, default=None,
        help="workers: ranks analysed in parallel processes, or one large trace parsed in byte ranges on threads (default: CPU count)",
    )
    parser.add_argument(
        "--cluster", metavar="ADDRESS", default=None,
        help="extract the ranks on a Dask cluster: a scheduler address (tcp://host:8786) or 'local' "
        "(needs pip install 'torchscope[cluster]'; docs/distributed.md)",
    )
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the parsed-trace cache")
    add_width_option(parser)
    parser.add_argument("--by-shape", action="store_true", help="terminal: group the operator table by input shape")
    parser.add_argument("--top", type=_positive, default=10, help="terminal: rows per table (default 10)")
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    from torchscope.pipeline.analyze import analyze_run
    from torchscope.render.registry import RenderOptions, renderer

    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs must be at least 1")
    width = report_width(args.width, None if args.output else sys.stdout)
    if args.output:
        check_output_target(args.output, args.paths)
    with load_progress(enabled=sys.stderr.isatty()) as progress:
        run = analyze_run(args.paths, jobs=args.jobs, use_cache=not args.no_cache, progress=progress,
                          sidecars=None if args.format == "html" else (), cluster=args.cluster)  # only the page draws sidecars
    report = run.report
    color = args.output is None and sys.stdout.isatty()
    options = RenderOptions(width=width, color=color, by_shape=args.by_shape, top=args.top, sidecars=run.sidecars)
    text = renderer(args.format).render(report, options)
    if args.output:
        write_report(args.output, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    _warn(report.warnings, report.run.partial)
    return 0


def _warn(warnings: list[str], partial: bool) -> None:
    """One line on stderr when the report has warnings (the input was damaged, or a part of it was left
    out on purpose), so the user sees it whatever the format."""
    if not warnings:
        return
    more = f" (and {len(warnings) - 1} more in the report)" if len(warnings) > 1 else ""
    line = one_line(f"{warnings[0]}{more}")  # one line, control characters escaped, even with odd file names
    print(f"torchscope: warning: {'partial report: ' if partial else ''}{line}", file=sys.stderr)
