"""A Dask worker's memory and the tasks it holds as the ranks go by: one local worker (profiler off, as
`--cluster local` runs it), N synthetic ranks (benchmarks/ranks_scale.py's traces), and every EVERY ranks
the worker's current RSS, its high-water mark (VmHWM), the tasks it holds, and the scheduler's. `bounded`
submits them as torchscope does (pipeline/cluster.py's window); `all` submits every rank at once (as
torchscope did before), releasing each result as it arrives. docs/performance.md has the figures.

    python -P benchmarks/dask_worker_series.py 1024 128 bounded
    python -P benchmarks/dask_worker_series.py 1024 128 all
"""
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def probe(dask_worker=None):  # runs in the worker
    status = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(("VmRSS", "VmHWM"))}
    return {"rss_mb": round(status["VmRSS"] / 1024, 1), "hwm_mb": round(status["VmHWM"] / 1024, 1),
            "worker_tasks": len(dask_worker.state.tasks), "worker_data": len(dask_worker.data)}


def main() -> None:
    spec = importlib.util.spec_from_file_location("ranks_scale", os.path.join(REPO, "benchmarks", "ranks_scale.py"))
    ranks_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ranks_scale)
    import dask
    from distributed import Client, LocalCluster, as_completed

    from torchscope.analysis.catalogue import all_analyses
    from torchscope.pipeline import cluster as C
    from torchscope.pipeline.analyze import discover_all, group_by_worker

    n, every, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    folder = Path(tempfile.mkdtemp()) / f"ranks{n}"
    ranks_scale.write_ranks(folder, n)
    groups = group_by_worker(discover_all([folder]).refs)
    with dask.config.set({"distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL)
    client = Client(cluster)
    shared = client.scatter(list(all_analyses(None)), broadcast=True)

    def show(done: int) -> None:
        [worker] = client.run(probe).values()
        held = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
        print(json.dumps({"ranks_done": done, **worker, "scheduler_tasks": held}), flush=True)

    show(0)
    if mode == "bounded":
        def submit(i, group):
            if i and i % every == 0:
                show(i)
            return client.submit(C._extract_or_error, group, shared, False, i, pure=False)
        C._bounded_map(client, groups, submit)
    else:
        futures = [client.submit(C._extract_or_error, g, shared, False, i, pure=False) for i, g in enumerate(groups)]
        completed = as_completed(futures, with_results=True)
        del futures
        for done, (future, _) in enumerate(completed, 1):
            future.release()
            if done % every == 0 and done < n:
                show(done)
    show(n)
    client.close()
    cluster.close()


if __name__ == "__main__":
    main()
