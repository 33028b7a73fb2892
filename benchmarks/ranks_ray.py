"""Ray against Dask for `--cluster` (docs/dependencies.md): one analysis of a folder of ranks with the
per-rank extraction on Ray (2 CPUs, the analyses put once, a window of 8 tasks per CPU, results taken as
they complete) in place of pipeline/cluster.py's Dask, or on Dask itself; prints the wall time (start and
stop included), the main and largest child RSS peaks (RUSAGE_CHILDREN: Ray's GCS server and raylet
included), the straggler, and whether the Report equals the local pool's. Ray is no dependency of
torchscope: run it from a scratch venv that can also import torchscope, e.g.

    python -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install ray
    python -P benchmarks/ranks_scale.py ...  # or write_ranks(folder, 64) from it
    PYTHONPATH=. /tmp/rayenv/bin/python -P benchmarks/ranks_ray.py FOLDER ray|dask
"""
import json, os, resource, sys, time
from pathlib import Path
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def extract_on_ray(groups, analyses, use_cache, address, workers):
    import ray
    from torchscope.pipeline.cluster import _extract_or_error
    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(_extract_or_error)
        shared = ray.put(list(analyses))
        window, pending, results, index_of, it = 8 * workers, [], [None] * len(groups), {}, iter(enumerate(groups))
        def submit():
            step = next(it, None)
            if step is not None:
                ref = task.remote(step[1], shared, use_cache, step[0]); index_of[ref] = step[0]; pending.append(ref)
        for _ in range(window): submit()
        while pending:
            done, pending[:] = ray.wait(pending, num_returns=1)
            for ref in done:
                results[index_of.pop(ref)] = ray.get(ref); submit()
        return results
    finally:
        ray.shutdown()

def main():
    folder, engine = Path(sys.argv[1]), sys.argv[2]
    from torchscope.pipeline import cluster
    from torchscope.pipeline.analyze import analyze
    from torchscope.report.model import encode_report
    if engine == "ray":
        cluster.extract_on_cluster = extract_on_ray
    t = time.perf_counter()
    report = analyze(folder, jobs=2, use_cache=False, cluster="local")
    wall = time.perf_counter() - t
    main_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    worker_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    same = encode_report(report) == encode_report(analyze(folder, jobs=2, use_cache=False))
    s = report.distributed.straggler
    print(json.dumps({"engine": engine, "wall_s": round(wall, 2), "main_peak_mb": round(main_peak, 1), "worker_peak_mb": round(worker_peak, 1),
                      "straggler": s.rank if s else None, "late_phase": s.late_phase if s else None, "same_as_local_pool": same,
                      "load": open("/proc/loadavg").read().split()[0]}), flush=True)

if __name__ == "__main__":
    main()
