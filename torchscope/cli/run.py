"""``torchscope run [options] script.py [args...]`` / ``torchscope run [options] -m module [args...]``.

Runs the target as ``python`` would, with the profiler, phase labels and step detection on; then prints
the report and the run directory on stderr (the script's own stdout stays exactly its own). The exit
code is the script's. Under torchrun every rank captures; rank 0 reports.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from torchscope.errors import UsageError

if TYPE_CHECKING:  # pragma: no cover - the runner imports torch; load it only when running
    from torchscope.capture.runner import CaptureConfig, RunOutcome, Target


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """The profiler options shared by ``run`` (defaults: docs/capture.md)."""
    group = parser.add_argument_group("capture")
    group.add_argument("--out", metavar="DIR", default="runs",
                       help="run directory if DIR does not exist, else a new folder inside it (default: runs)")
    group.add_argument("--skip-first", type=_non_negative, default=0, metavar="N", help="steps ignored first (0)")
    group.add_argument("--wait", type=_non_negative, default=1, metavar="N", help="steps idle per cycle (1)")
    group.add_argument("--warmup", type=_non_negative, default=1, metavar="N", help="profiler warm-up steps (1)")
    group.add_argument("--active", type=_positive, default=3, metavar="N", help="steps recorded per cycle (3)")
    group.add_argument("--repeat", type=_non_negative, default=1, metavar="N",
                       help="cycles, one trace file each; 0 = until the end (1)")
    group.add_argument("--no-memory", action="store_true", help="do not record memory events")
    group.add_argument("--no-stack", action="store_true", help="do not record Python stacks (less overhead)")
    group.add_argument("--no-shapes", action="store_true", help="do not record input shapes")
    group.add_argument("--no-flops", action="store_true", help="do not estimate FLOPs")
    group.add_argument("--no-phases", action="store_true", help="do not label forward/backward/optimizer")
    group.add_argument("--stop-after-active", action="store_true",
                       help="end the script (exit 0) once the active window(s) are captured")
    group.add_argument("--no-report", action="store_true", help="do not analyse and print the report at the end")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a training script under the profiler",
        description="Run a script (or -m module) exactly as python would, profiled; then report.",
        usage="torchscope run [options] (script.py | -m module) [args ...]",
    )
    add_capture_options(parser)
    # REMAINDER keeps the script's own flags (even ones named like ours) for the script.
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="module",
                        help="run a module as `python -m module` would; the rest goes to it")
    parser.add_argument("target", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                        help="the script and its arguments")
    parser.set_defaults(func=execute)


def target_from_args(args: argparse.Namespace) -> Target:
    from torchscope.capture.runner import Target

    if args.module is not None:
        if not args.module:
            raise UsageError("-m needs a module name")
        return Target("module", args.module[0], tuple(args.module[1:]))
    if not args.target:
        raise UsageError("nothing to run: give a script (torchscope run train.py) or -m module")
    return Target("script", args.target[0], tuple(args.target[1:]))


def config_from_args(args: argparse.Namespace) -> CaptureConfig:
    from torchscope.capture.runner import CaptureConfig

    return CaptureConfig(
        out=args.out,
        wait=args.wait,
        warmup=args.warmup,
        active=args.active,
        repeat=args.repeat,
        skip_first=args.skip_first,
        record_shapes=not args.no_shapes,
        profile_memory=not args.no_memory,
        with_stack=not args.no_stack,
        with_flops=not args.no_flops,
        phase_labels=not args.no_phases,
        stop_after_active=args.stop_after_active,
    )


def execute(args: argparse.Namespace) -> int:
    from torchscope.capture.runner import check_target, run_target

    target = target_from_args(args)
    check_target(target)  # before torch is even imported: a typo costs no time
    outcome = run_target(target, config_from_args(args))
    print_script_ending(outcome)
    if outcome.status == "stopped":
        print("torchscope: the active window is captured; script stopped (--stop-after-active)", file=sys.stderr)
    present(outcome, report=not args.no_report, stream=sys.stderr)
    if isinstance(outcome.exception, KeyboardInterrupt):
        _die_by_sigint()
    return outcome.exit_code


def _die_by_sigint() -> None:
    """End as Python ends on an uncaught KeyboardInterrupt: killed by SIGINT (status 130 in a shell,
    -2 for a parent process), so callers that check how the child died see no difference."""
    import os
    import signal

    _flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def print_script_ending(outcome: RunOutcome) -> None:
    """What Python prints when a script ends this way: the traceback, or sys.exit's message."""
    if outcome.exception is not None:
        exc = outcome.exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
    elif outcome.exit_message is not None:
        print(outcome.exit_message, file=sys.stderr)
    _flush()


def present(outcome: RunOutcome, *, report: bool, stream: TextIO, json_report: bool = False) -> None:
    """After the run: the report (rank 0 only, once every local rank has written its manifest) and
    where the run directory is. Never raises, never changes the exit code."""
    from torchscope.capture import endreport

    prof = outcome.profiler
    run_dir = prof.run_dir
    if run_dir is None or prof.dist.rank != 0:
        return
    try:
        if prof.dist.distributed and prof.dist.local_world_size == prof.dist.world_size:
            if not endreport.wait_for_manifests(run_dir, prof.dist.world_size):
                print("torchscope: warning: not every rank wrote its manifest; reporting what is there",
                      file=sys.stderr)
        if report and prof.trace_files:
            built = endreport.build_report(run_dir)
            if built is not None:
                text = endreport.render_terminal(built)
                if text is not None:
                    stream.write(text if text.endswith("\n") else text + "\n")
                    stream.flush()
                if json_report:
                    endreport.write_json_report(built, run_dir / "report.json")
        print(f"torchscope: run directory: {run_dir}", file=sys.stderr)
    except KeyboardInterrupt:
        print("torchscope: report interrupted", file=sys.stderr)
    _flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
