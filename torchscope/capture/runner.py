"""Run an unmodified script or module exactly as ``python`` would, with the profiler on.

``python script.py args`` and ``python -m pkg.module args`` semantics kept here: ``sys.argv``
(``[script, *args]``; for ``-m`` runpy puts the module's file first), ``sys.path[0]`` (the script's
real directory; the current directory for ``-m``), ``__name__ == "__main__"`` with the script as
``sys.modules["__main__"]``, and the exit code (``SystemExit`` semantics, including ``sys.exit("msg")``).
All of it is restored afterwards.

The runner only *returns* what happened (:class:`RunOutcome`); printing the traceback or the message
of ``sys.exit("msg")`` is the CLI's job.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
import zipfile
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import msgspec

from torchscope.errors import InputError, TorchscopeError
from torchscope.rundir.config import CaptureConfig
from torchscope.rundir.manifest import Status

if TYPE_CHECKING:  # pragma: no cover - the profiler imports torch; only run_target needs it
    from torchscope.capture.profiler import Profiler


class Target(msgspec.Struct, frozen=True):
    """What to run: a script path or a module name, and its arguments."""

    kind: Literal["script", "module"]
    name: str
    args: tuple[str, ...] = ()

    @property
    def run_name(self) -> str:
        """Name for the run folder: the script's stem or the module's last component."""
        return Path(self.name).stem if self.kind == "script" else self.name.rsplit(".", 1)[-1]

    @property
    def command(self) -> list[str]:
        """The command line as the user would type it after ``python``."""
        head = [self.name] if self.kind == "script" else ["-m", self.name]
        return [*head, *self.args]


class RunOutcome(msgspec.Struct):
    """How the target ended, and where its capture went."""

    exit_code: int
    status: Status
    profiler: Profiler
    exception: BaseException | None = None  # to print as Python would (traceback already trimmed)
    exit_message: str | None = None  # sys.exit("msg"): Python prints it on stderr
    forked_child: bool = False  # a process the script forked ended here: no end-of-run work in it

    @property
    def run_dir(self) -> Path | None:
        return self.profiler.run_dir


def check_target(target: Target) -> None:
    """Fail before profiling anything when the target cannot be found (Python's own errors)."""
    if target.kind == "script":
        if not os.path.exists(target.name):
            raise InputError(f"can't open file {target.name!r}: [Errno 2] No such file or directory")
        return
    saved_path = sys.path[:]
    sys.path[0:1] = [os.getcwd()]  # as `python -m` searches (not the console script's folder)
    try:
        spec = importlib.util.find_spec(target.name)
    except (ImportError, ValueError) as exc:
        raise TorchscopeError(f"Error while finding module specification for {target.name!r} ({exc})") from exc
    finally:
        sys.path[:] = saved_path
    if spec is None:
        raise TorchscopeError(f"No module named {target.name}")


def run_target(target: Target, config: CaptureConfig, verbose: bool = False) -> RunOutcome:
    """Run ``target`` under the profiler and return its outcome. Never raises for the script's sake:
    ``SystemExit``, ``KeyboardInterrupt`` and exceptions become the outcome. Unless ``verbose``, torch's
    and Kineto's log lines about the capture are kept off stderr (capture/quiet.py)."""
    check_target(target)
    from torchscope.capture.quiet import quiet_torch_import

    with quiet_torch_import(not verbose):
        from torchscope.capture.profiler import CaptureComplete, Profiler

    # The config's fields are the Profiler's first keywords.
    profiler = Profiler(**msgspec.structs.asdict(config), name=target.run_name, auto_step=True, command=target.command, verbose=verbose)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    outcome: RunOutcome | None = None
    started_pid = os.getpid()
    try:
        _prepare_sys(target)
        profiler.start()
        try:
            _execute(target)
            outcome = RunOutcome(0, "complete", profiler)
        except CaptureComplete:
            outcome = RunOutcome(0, "stopped", profiler)
        except SystemExit as exc:
            outcome = _exit_outcome(exc, profiler)
        except KeyboardInterrupt as exc:
            outcome = RunOutcome(130, "interrupted", profiler, exception=_trimmed(exc))
        except BaseException as exc:  # noqa: B036 - the script's error becomes its exit status
            outcome = RunOutcome(1, "error", profiler, exception=_trimmed(exc))
    finally:
        try:
            if os.getpid() != started_pid:
                pass  # a forked child left the script (sys.exit in it): the capture is its parent's to end
            elif outcome is not None:
                profiler.close(outcome.status, outcome.exit_code)
            else:
                profiler.close("error")
        finally:
            sys.argv[:] = saved_argv
            sys.path[:] = saved_path
    assert outcome is not None  # every way out of the script is caught above
    outcome.forked_child = os.getpid() != started_pid
    return outcome


def _prepare_sys(target: Target) -> None:
    if target.kind == "script":
        sys.argv[:] = [target.name, *target.args]
        path = os.path.realpath(target.name)
        if os.path.isdir(path) or _is_zip(path):
            del sys.path[0:1]  # runpy.run_path puts a directory or zip application first itself
        else:
            sys.path[0:1] = [os.path.dirname(path)]  # python: the script's symlink-resolved directory
    else:
        sys.argv[:] = [target.name, *target.args]  # runpy replaces argv[0] with the module's file
        sys.path[0:1] = [os.getcwd()]


def _is_zip(path: str) -> bool:
    return os.path.isfile(path) and zipfile.is_zipfile(path)


def _execute(target: Target) -> None:
    if target.kind == "module":
        _run_module(target.name)
    elif os.path.isdir(target.name) or _is_zip(target.name):
        runpy.run_path(target.name, run_name="__main__")
    else:
        _run_script_file(target.name)


def _fresh_main(**fields: object) -> types.ModuleType:
    """A `__main__` module with the globals python gives one (`__annotations__`, `__builtins__`, ...)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__annotations__={}, __builtins__=builtins, **fields)
    return main


def _run_module(name: str) -> None:
    """Run a module as ``python -m name``: in a fresh ``__main__`` module, with runpy's own ``-m`` entry
    point (the one python uses), so globals, ``sys.argv[0]`` and ``__spec__`` are python's."""
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is None:  # pragma: no cover - every CPython since 2.7 has it
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        return
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = _fresh_main(__file__=None, __cached__=None)
    try:
        run_as_main(name, True)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _run_script_file(path: str) -> None:
    """Execute a script file as ``__main__`` the way ``python path`` does.

    Not ``runpy.run_path``: it rewrites ``sys.argv[0]``, and Python >= 3.9 keeps ``argv[0]`` as typed
    while giving ``__main__`` an absolute ``__file__`` (also the file name in tracebacks).
    """
    filename = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)  # as python: `./x.py` stays in it
    with open(filename, "rb") as fh:  # bytes: compile() honours the source's encoding declaration
        source = fh.read()
    code = compile(source, filename, "exec", dont_inherit=True)  # no __future__ flags from this module
    main = _fresh_main(
        __file__=filename,
        __cached__=None,
        __package__=None,
        __spec__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", filename),
    )
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling and multiprocessing look the script's classes up here
    try:
        exec(code, main.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _exit_outcome(exc: SystemExit, profiler: Profiler) -> RunOutcome:
    # Python's rules: None -> 0, an int -> itself, anything else -> printed on stderr and exit 1.
    code = exc.code
    if code is None:
        return RunOutcome(0, "complete", profiler)
    if isinstance(code, int):
        return RunOutcome(code, "complete", profiler)
    return RunOutcome(1, "complete", profiler, exit_message=str(code))


def _trimmed(exc: BaseException) -> BaseException:
    """Drop the runner's and runpy's frames, so the traceback starts in the script like Python's."""
    skip = {__name__, "runpy"}
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in skip:
        tb = tb.tb_next
    return exc.with_traceback(tb)
