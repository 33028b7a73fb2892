"""The process pool torchscope analyses with (ranks in parallel, byte ranges of one large trace)."""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures import ProcessPoolExecutor


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A pool of forked workers (where the platform forks) that leave Ctrl-C to the main process.

    A terminal's Ctrl-C reaches the whole process group: without this, every worker would print its own
    KeyboardInterrupt traceback on top of the main process's one-line "interrupted"."""
    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=context, initializer=_ignore_sigint)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
