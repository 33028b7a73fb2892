"""The capture's signal handlers (capture/signals.py) in a forked child: a `multiprocessing` fork pool's
worker must end on SIGTERM as it would without torchscope (`Pool.terminate()` sends it). With the capture's
handler inherited, 2 of 30 fork pools under `torchscope run` (three at a time) hung in Pool.__exit__."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from torchscope.capture.signals import DeferredSignals, SigtermSaver

pytestmark = pytest.mark.skipif(sys.platform == "win32" or not hasattr(os, "fork"), reason="needs fork")


def _in_child(check: str, **names: object) -> str:
    """Fork; the child writes what `check` evaluates to (with `signal` and `names` in scope) and exits."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery beyond this
        os.close(read)
        os.write(write, repr(eval(check, {"signal": signal, **names})).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)
    return answer


def test_a_forked_child_gets_the_default_sigterm_back() -> None:
    saved: list[int] = []
    saver = SigtermSaver(lambda: saved.append(os.getpid()))
    assert saver.install()
    try:
        assert signal.getsignal(signal.SIGTERM) == saver._handle
        assert _in_child("signal.getsignal(signal.SIGTERM) is signal.SIG_DFL") == "True"
        interrupt = signal.getsignal(signal.SIGINT)  # pytest's, Python's default, or ignored (a background job)
        with DeferredSignals():  # inside a step transition: the child gets the handlers ours replaced
            assert _in_child("signal.getsignal(signal.SIGTERM) is signal.SIG_DFL") == "True"
            assert _in_child("signal.getsignal(signal.SIGINT) == interrupt", interrupt=interrupt) == "True"
        assert _in_child("signal.getsignal(signal.SIGTERM) is signal.SIG_DFL") == "True"  # after the nesting too
    finally:
        saver.uninstall()
    assert saved == [] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_child_forked_after_uninstall_keeps_the_programs_handler() -> None:
    def mine(signum: int, frame: object) -> None:
        return None

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        assert _in_child("signal.getsignal(signal.SIGTERM).__name__") == "'mine'"
    finally:
        signal.signal(signal.SIGTERM, previous)
