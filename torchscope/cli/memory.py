"""`torchscope memory SNAPSHOT.pickle`: summarise a PyTorch CUDA memory snapshot (the allocator's state,
the peak of its recorded history, the call sites holding memory, fragmentation)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from torchscope.analysis.memory_snapshot import summarize_snapshot
from torchscope.cli.output import check_output_target, write_report
from torchscope.cli.width import add_width_option, report_width
from torchscope.render.snapshot_terminal import render_snapshot
from torchscope.text import path_text
from torchscope.trace.snapshot import load_snapshot


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "memory", help="summarise a CUDA memory snapshot (torch.cuda.memory._dump_snapshot pickle)"
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT.pickle", help="the snapshot (loaded without running any code from it)")
    parser.add_argument("--format", choices=("terminal", "json"), default="terminal")
    parser.add_argument("-o", "--output", help="write to this file instead of stdout")
    add_width_option(parser)
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    path = Path(args.snapshot)
    width = report_width(args.width, None if args.output else sys.stdout)
    if args.output:
        check_output_target(args.output, [args.snapshot])
    summary = summarize_snapshot(load_snapshot(path), path_text(path))
    if args.format == "json":
        text = msgspec.json.format(msgspec.json.encode(summary).decode(), indent=2)
    else:
        text = render_snapshot(summary, width=width)
    if args.output:
        write_report(args.output, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
