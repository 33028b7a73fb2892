"""Signals of a child process a test interrupts."""

from __future__ import annotations

import signal


def default_signals() -> None:
    """`preexec_fn` of a child the test sends SIGINT/SIGTERM: the dispositions an interactive shell leaves.
    A suite started in the background (`make test &`, `nohup ... &`) inherits SIGINT ignored, and Python,
    like torchscope, then keeps ignoring it: the child would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
