"""`torchscope view [LOGDIR]`: serve the dashboards of the runs under LOGDIR on a local port."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchscope.errors import InputError
from torchscope.rundir.config import CaptureConfig

DEFAULT_PORT = 6007


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("view", help="serve the dashboards of a directory of runs in the browser")
    parser.add_argument("logdir", nargs="?", default=str(CaptureConfig().out), metavar="LOGDIR",
                        help="directory of runs (default: %(default)s, where `run` and `demo` write them)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    parser.set_defaults(func=execute)


def execute(args: argparse.Namespace) -> int:
    from torchscope.server.app import make_server

    logdir = Path(args.logdir)
    if not logdir.is_dir():
        raise InputError(f"{logdir}: not a directory")
    try:
        server = make_server(logdir, args.host, args.port)
    except OSError as exc:
        raise InputError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc})") from None
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"torchscope view: serving {logdir} at http://{host}:{port}/ (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
