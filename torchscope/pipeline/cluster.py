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
from typing import Any, Sequence

import numpy as np

from torchscope.analysis.registry import Analysis
from torchscope.errors import InputError
from torchscope.pipeline.rank_extracts import RankExtracts, extract_rank
from torchscope.trace.discover import TraceFileRef

LOCAL = "local"
CONNECT_TIMEOUT_S = 10


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


def extract_on_cluster(
    groups: list[list[TraceFileRef]], analyses: Sequence[Analysis[Any]], use_cache: bool, address: str, workers: int
) -> list[RankExtracts | InputError]:
    """Every rank's extracts (or its input error), in the order of `groups`."""
    client = _client(address, workers)
    try:
        from distributed import as_completed

        shared = client.scatter(list(analyses), broadcast=True)  # sent to each worker once, not with every rank
        futures = [client.submit(_extract_or_error, group, shared, use_cache, i, pure=False) for i, group in enumerate(groups)]
        index_of = {future.key: i for i, future in enumerate(futures)}
        results: list[RankExtracts | InputError | None] = [None] * len(futures)
        # Each result is taken as it completes and its future released at once, so a worker holds only the
        # extracts not yet fetched, not every rank's until the end (bounded worker memory at 1,024 ranks).
        completed = as_completed(futures, with_results=True)
        del futures
        for future, value in completed:
            results[index_of[future.key]] = value
            future.release()
        return [r for r in results if r is not None]
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
