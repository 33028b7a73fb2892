"""``--width`` for every command that prints a report, and the terminal's own width by default.

A report printed on a terminal fits it: the width is ``COLUMNS`` when set (as :func:`shutil.get_terminal_size`
reads it), else the terminal the report goes to (stdout for ``analyze``/``diff``/``demo``, stderr for
``run``), else 100 columns (a pipe or a file: the same text wherever it is run).
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import TextIO

from torchscope.cli.output import MAX_WIDTH
from torchscope.errors import UsageError

MIN_WIDTH = 20  # narrower, the tables have no room for a single column
DEFAULT_WIDTH = 100  # not a terminal


def add_width_option(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--width", type=int, default=None, metavar="COLUMNS",
                        help=f"report width (default: the terminal's, else {DEFAULT_WIDTH})")


def report_width(width: int | None, stream: TextIO | None) -> int:
    """The width to render at: ``width`` if given (checked), else the width of ``stream``'s terminal
    (None: the report goes to a file)."""
    if width is not None:
        if width < MIN_WIDTH:
            raise UsageError(f"--width must be at least {MIN_WIDTH}")
        if width > MAX_WIDTH:
            raise UsageError(f"--width must be at most {MAX_WIDTH}")
        return width
    return max(MIN_WIDTH, min(MAX_WIDTH, terminal_width(stream))) if stream is not None else DEFAULT_WIDTH


def terminal_width(stream: TextIO) -> int:
    """``COLUMNS``, else the columns of the terminal behind ``stream``, else :data:`DEFAULT_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns or DEFAULT_WIDTH
    except (AttributeError, OSError, ValueError):  # a stream without a file descriptor (captured output)
        pass
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns if stream.isatty() else DEFAULT_WIDTH
