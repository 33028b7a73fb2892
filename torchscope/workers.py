"""The process pool torchscope analyses with (ranks in parallel, byte ranges of one large trace)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor


def process_pool(max_workers: int) -> "ProcessPoolExecutor":
    """A pool of forked workers (where the platform forks) that leave Ctrl-C to the main process.

    A terminal's Ctrl-C reaches the whole process group: without this, every worker would print its own
    KeyboardInterrupt traceback on top of the main process's one-line "interrupted"."""
    # Imported here: multiprocessing costs ~2 MB and ~20 ms, and most analyses never start a pool.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=context, initializer=_ignore_sigint)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
