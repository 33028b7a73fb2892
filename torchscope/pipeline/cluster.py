"""Per-rank extraction on a Dask cluster (`torchscope analyze --cluster ADDRESS`), for runs whose ranks
are more than one machine's pool can analyse (docs/distributed.md, docs/dependencies.md for why Dask).

Each rank is one task: the same function the local process pool runs (`extract_rank` through the table
and extract caches), so the extracts, and the Report reduced from them, are the same as with the local
pool. The trace paths must be readable by the workers (a shared file system, as on a training cluster);
only the small extracts travel back. `ADDRESS` is a scheduler (`tcp://host:8786`), or `local` for a
cluster of worker processes on this machine.

Dask is an optional extra (`pip install 'torchscope[cluster]'`), imported only here and only when asked.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from torchscope.analysis.registry import Analysis
from torchscope.errors import InputError
from torchscope.pipeline.rank_extracts import RankExtracts, extract_rank
from torchscope.trace.discover import TraceFileRef

LOCAL = "local"
CONNECT_TIMEOUT_S = 10
# Tasks in flight per worker thread: enough that a thread never waits for its next rank while a result
# travels back through the client (2 was slower than submitting all at once on a loaded machine, 8 was
# not), few enough that what the cluster holds does not grow with the rank count.
IN_FLIGHT_PER_THREAD = 8


def _client(address: str, workers: int) -> Any:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--cluster needs Dask: pip install 'torchscope[cluster]'") from None
    if address == LOCAL:
        # Dask's own log lines (a worker's heartbeat racing the shutdown) would break the one-line contract.
        # Its worker processes log on their own stderr, which is ours: they read this when they import Dask.
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
        import dask

        # Dask's statistical profiler samples each worker every 10 ms and keeps the call trees (and the
        # source lines it read): measured at 2 MB after 64 ranks and 20 MB after 1,024, the bulk of a
        # worker's growth. Nobody looks at it here (no dashboard), so our own local cluster runs without
        # it (the nannies hand this config to the workers they start).
        with warnings.catch_warnings(), dask.config.set({"distributed.worker.profile.enabled": False}):
            # "port 8787 in use" when another local cluster runs: it takes another
            warnings.simplefilter("ignore")
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.CRITICAL)
        return Client(cluster)
    try:
        return Client(address, timeout=f"{CONNECT_TIMEOUT_S}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(f"--cluster {address}: cannot reach the Dask scheduler ({exc})") from None


def _extract_or_error(refs: list[TraceFileRef], analyses: Sequence[Analysis[Any]], use_cache: bool, index: int) -> RankExtracts | InputError:
    # An unreadable rank comes back as its error (one line), as from the local pool, not as a task failure;
    # numpy's warnings on damaged traces stay quiet, as in the local pool (pipeline.analyze.quiet_numerics).
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            return extract_rank(refs, analyses, use_cache, index)
    except InputError as exc:
        return exc


def _bounded_map(client: Any, groups: list[list[TraceFileRef]], submit: Callable[[int, list[TraceFileRef]], Any]) -> list[Any]:
    """`submit(i, group)` for every group, at most IN_FLIGHT_PER_THREAD x the cluster's threads at a time.

    Submitting every rank at once hands the whole graph to the workers: Dask queues only "root-ish" tasks
    on the scheduler, and a task that reads the scattered analyses is not one, so each worker held every
    rank's task until it ran (measured: 920 tasks on one worker after 128 of 1,024 ranks, 65 -> 100 MB;
    with the window, 71-75 MB throughout; docs/performance.md).
    Each result is taken as it completes and its future released at once, and the next rank is submitted
    then, so the workers hold a bounded window of tasks and unfetched extracts whatever the rank count."""
    from distributed import as_completed

    window = max(2, IN_FLIGHT_PER_THREAD * sum(client.nthreads().values()))
    pending = iter(enumerate(groups))
    index_of: dict[Any, int] = {}
    # On this client's event loop: without `loop`, Dask takes the loop of whichever client was made last
    # in the process (`default_client()`), which need not be this one.
    completed = as_completed(with_results=True, loop=client.loop)

    def submit_next() -> None:
        step = next(pending, None)
        if step is not None:
            future = submit(*step)
            index_of[future.key] = step[0]
            completed.add(future)

    for _ in range(window):
        submit_next()
    results: list[Any] = [None] * len(groups)
    for future, value in completed:
        results[index_of.pop(future.key)] = value
        future.release()
        del future
        submit_next()
    return results


def extract_on_cluster(
    groups: list[list[TraceFileRef]], analyses: Sequence[Analysis[Any]], use_cache: bool, address: str, workers: int
) -> list[RankExtracts | InputError]:
    """Every rank's extracts (or its input error), in the order of `groups`."""
    client = _client(address, workers)
    try:
        # Sent to each worker once, not with every rank. Under a fresh key (hash=False): the default key is
        # the content's hash, the same for every analysis with the same catalogue, and scattering it while the
        # scheduler still releases it from an earlier client is a known Dask race (dask/distributed#3703,
        # #4907: a lost key, a scatter that never returns) on a long-lived cluster.
        shared = client.scatter(list(analyses), broadcast=True, hash=False)
        return _bounded_map(client, groups, lambda i, group: client.submit(_extract_or_error, group, shared, use_cache, i, pure=False))
    finally:
        cluster = client.cluster if address == LOCAL else None
        if cluster is not None:
            client.retire_workers(close_workers=True)  # workers stop before the scheduler they beat to
            cluster.close()
        # Dask's INFO lines on connections closing are not the user's business; they come from its event
        # loop while and after the client closes (and LocalCluster restores its level on close), so this
        # is set here and stays set.
        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        client.close()
