"""A progress bar on stderr while traces load and analyse: only on a TTY, and only for long loads."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

SHOW_AFTER_S = 1.0  # short analyses print nothing at all


@contextmanager
def load_progress(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """Yields a `progress(done, total)` callback (None when disabled), in bytes of trace text. The bar
    appears once the load has taken SHOW_AFTER_S (a timer, so one long file shows it too), shows MB done
    / MB in all with the elapsed time, and is cleared at the end."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bar = Progress(
        SpinnerColumn(), TextColumn("analysing traces"), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
        console=Console(file=sys.stderr), transient=True, redirect_stdout=False, redirect_stderr=False,
    )
    task = bar.add_task("load", total=None)
    lock = threading.Lock()
    state = {"shown": False, "closed": False}

    def show() -> None:
        with lock:
            if not state["closed"]:
                bar.start()
                state["shown"] = True

    timer = threading.Timer(SHOW_AFTER_S, show)
    timer.daemon = True
    timer.start()
    try:
        yield lambda done, total: bar.update(task, completed=done, total=total)
    finally:
        timer.cancel()
        with lock:
            state["closed"] = True
            if state["shown"]:
                bar.stop()
