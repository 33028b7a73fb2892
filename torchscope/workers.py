"""The process pool torchscope analyses with (ranks in parallel; byte ranges of one large trace when the
compiled scanner is missing)."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

# Imported once by the fork server, so each worker starts with numpy and the analyses already loaded.
_PRELOAD = ["torchscope.pipeline.rank_extracts", "torchscope.analysis.catalogue", "torchscope.trace.ranges"]


def process_pool(max_workers: int) -> "ProcessPoolExecutor":
    """A pool whose workers leave Ctrl-C to the main process.

    A forked child inherits every lock held by the caller's other threads (a progress bar, a server's
    handlers) and can hang on one, so workers are forked only from a process running no other thread
    (fork is the fastest start and does not re-import the caller's main script); otherwise they come
    from a fork server, a clean single-threaded process, or are spawned where there is none. A
    terminal's Ctrl-C reaches the whole process group: the workers ignore it, so the main process alone
    prints one "interrupted" line."""
    # Imported here: multiprocessing costs ~2 MB and ~20 ms, and most analyses never start a pool.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(_PRELOAD)
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=context, initializer=_ignore_sigint)


def start_method() -> str:
    """"fork" when this process runs a single thread and can fork, else "forkserver", else "spawn"."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
