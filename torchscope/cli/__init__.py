"""Command-line interface: one module per subcommand, `main(argv) -> int`.

Each subcommand module exposes ``register(subparsers)`` which adds its parser and sets
``func=execute`` where ``execute(args) -> int``. Typed :class:`TorchscopeError` exceptions
become one line on stderr and their exit code; nothing below this layer calls ``sys.exit``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Sequence

from torchscope import __version__
from torchscope.errors import TorchscopeError
from torchscope.text import one_line

SUBCOMMANDS = ("run", "analyze", "demo", "view", "diff", "check", "tune", "memory")
INTERNAL_ERROR_EXIT = 3


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2 (its default)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"torchscope: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchscope", description="Why is my PyTorch training slow?")
    parser.add_argument("--version", action="version", version=f"torchscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging (timings)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"torchscope.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="torchscope: %(message)s")
    try:
        return int(args.func(args))
    except TorchscopeError as exc:
        print(f"torchscope: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("torchscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # last resort: a bug in torchscope must not end in a traceback
        print(f"torchscope: internal error: {type(exc).__name__}: {_one_line(exc)} (please report)", file=sys.stderr)
        return INTERNAL_ERROR_EXIT


def _one_line(exc: BaseException) -> str:
    return one_line(str(exc))[:500]
