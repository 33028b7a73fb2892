"""``torchscope run [options] script.py [args...]`` / ``torchscope run [options] -m module [args...]``.

Runs the target as ``python`` would, with the profiler, phase labels and step detection on; then prints
the report and the run directory on stderr (the script's own stdout stays exactly its own). The exit
code is the script's. Under torchrun every rank captures; rank 0 reports.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, Callable, TextIO

import msgspec

from torchscope.cli.width import add_width_option, report_width
from torchscope.errors import UsageError
from torchscope.rundir.config import SCHEDULE_MINIMUM, CaptureConfig
from torchscope.rundir.layout import HTML_REPORT_NAME, REPORT_NAME
from torchscope.text import printable

if TYPE_CHECKING:  # pragma: no cover - the runner imports torch; load it only when running
    from torchscope.capture.runner import RunOutcome, Target

# One option per CaptureConfig field; its name, default and bounds come from there, its words from here.
_SCHEDULE_HELP = {
    "skip_first": "steps ignored first",
    "wait": "steps idle per cycle",
    "warmup": "profiler warm-up steps",
    "active": "steps recorded per cycle",
    "repeat": "cycles, one trace file each; 0 = until the end",
}
_SWITCHES = {  # field: (flag, help); the flag turns the field's default around
    "profile_memory": ("--no-memory", "do not record memory events"),
    "with_stack": ("--no-stack", "do not record Python stacks (less overhead)"),
    "record_shapes": ("--no-shapes", "do not record input shapes"),
    "with_flops": ("--no-flops", "do not estimate FLOPs"),
    "phase_labels": ("--no-phases", "do not label forward/backward/optimizer"),
    "stop_after_active": ("--stop-after-active", "end the script (exit 0) once the active window(s) are captured"),
    "memory_snapshot": ("--memory-snapshot", "also record a CUDA memory snapshot beside the trace (CUDA only)"),
}


def _at_least(minimum: int) -> Callable[[str], int]:
    def count(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return count


def add_out_option(parser: argparse._ActionsContainer) -> None:  # a parser or an argument group
    """``--out DIR``, shared by ``run`` and ``demo``."""
    parser.add_argument("--out", metavar="DIR", default=CaptureConfig().out,
                        help="run directory if DIR does not exist, else a new folder inside it (default: %(default)s)")


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    """The profiler options of ``run``: one per :class:`CaptureConfig` field, with its default."""
    group = parser.add_argument_group("capture")
    add_out_option(group)
    defaults = CaptureConfig()
    for name, minimum in SCHEDULE_MINIMUM.items():
        group.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_at_least(minimum),
                           default=getattr(defaults, name), metavar="N", help=f"{_SCHEDULE_HELP[name]} (%(default)s)")
    for name, (flag, words) in _SWITCHES.items():
        default = getattr(defaults, name)
        group.add_argument(flag, dest=name, action="store_false" if default else "store_true", default=default,
                           help=words)
    group.add_argument("--trace-budget-mb", dest="trace_budget_mb", type=_at_least(0), metavar="MB",
                       default=defaults.trace_budget_mb,
                       help="largest trace file; beyond it the shortest Python calls are dropped (%(default)s; 0: none)")
    group.add_argument("--no-report", action="store_true", help="do not analyse and print the report at the end")
    add_width_option(group)
    # Also accepted after `run` (torchscope's own -v works before it); SUPPRESS keeps the main parser's value.
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="keep torch's and Kineto's log lines about the capture, and debug logging")


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
    if args.target[:1] == ["--"]:  # `torchscope run -- ./-dash.py`: what follows `--` is the script
        args.target = args.target[1:]
    if not args.target:
        raise UsageError("nothing to run: give a script (torchscope run train.py) or -m module")
    return Target("script", args.target[0], tuple(args.target[1:]))


def config_from_args(args: argparse.Namespace) -> CaptureConfig:
    """The :class:`CaptureConfig` of the parsed ``run`` options (each option is stored under its field's name)."""
    return CaptureConfig(**{field.name: getattr(args, field.name) for field in msgspec.structs.fields(CaptureConfig)})


def execute(args: argparse.Namespace) -> int:
    from torchscope.capture.runner import check_target, run_target

    target = target_from_args(args)
    report_width(args.width, None)  # a bad --width, like a typo, fails before anything runs
    check_target(target)  # before torch is even imported: a typo costs no time
    outcome = run_target(target, config_from_args(args), verbose=bool(getattr(args, "verbose", False)))
    print_script_ending(outcome)
    if outcome.forked_child:  # a child the script forked: it ends as under python, nothing more
        return outcome.exit_code
    if outcome.status == "stopped":
        print("torchscope: the active window is captured; script stopped (--stop-after-active)", file=sys.stderr)
    present(outcome, report=not args.no_report, stream=sys.stderr, width=args.width)
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


def present(
    outcome: RunOutcome, *, report: bool, stream: TextIO, json_report: bool = False, width: int | None = None
) -> None:
    """After the run: the report (rank 0 only, once every local rank has written its manifest, ``width``
    columns or the terminal's) and where the run directory is. Never raises, never changes the exit code."""
    from torchscope.cli import endreport

    prof = outcome.profiler
    run_dir = prof.run_dir
    if run_dir is None or prof.dist.rank != 0:
        return
    try:
        # A failing rank 0 ends as under python, at once: torchrun stops the other ranks, whose manifests
        # would never come (the wait would only delay the exit).
        failed = outcome.exit_code != 0 or outcome.status in ("error", "interrupted")
        if prof.dist.distributed and prof.dist.local_world_size == prof.dist.world_size and not failed:
            if not endreport.wait_for_manifests(run_dir, prof.dist.world_size):
                print("torchscope: warning: not every rank wrote its manifest; reporting what is there",
                      file=sys.stderr)
        if report and prof.trace_files:
            analysed = endreport.build_run(run_dir)
            built = analysed.report if analysed is not None else None
            if built is not None:
                text = endreport.render(built, "terminal", report_width(width, stream))
                if text is not None:
                    stream.write(text if text.endswith("\n") else text + "\n")
                    stream.flush()
                if json_report:
                    endreport.write_report(built, run_dir / REPORT_NAME, "json")
                endreport.write_html(analysed, run_dir / HTML_REPORT_NAME)
        print(f"torchscope: run directory: {printable(prof.run_dir_text)}", file=sys.stderr)
    except KeyboardInterrupt:
        print("torchscope: report interrupted", file=sys.stderr)
    _flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
