"""Where a Dask worker's memory goes while it extracts N synthetic ranks (benchmarks/ranks_scale.py's
traces): one local worker with tracemalloc on, and after the tasks, its RSS, its traced Python memory by
package and the largest allocation sites, and Dask's logs. PROF=0 runs the worker without Dask's
statistical profiler (as torchscope's --cluster local does). docs/performance.md has the figures.

    PROF=1 python -P benchmarks/dask_worker_memory.py 64 1024
"""
import sys, os, json, time, tracemalloc, logging, tempfile
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from pathlib import Path
import importlib.util
_spec = importlib.util.spec_from_file_location("ranks_scale", os.path.join(REPO, "benchmarks", "ranks_scale.py")); ranks_scale = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(ranks_scale)
from torchscope.pipeline.analyze import discover_all, group_by_worker
from torchscope.analysis.catalogue import all_analyses
from torchscope.pipeline import cluster as C

def start():
    import tracemalloc, gc; gc.collect(); tracemalloc.start(1)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def measure(dask_worker=None, top=12):
    import tracemalloc, gc, collections
    gc.collect()
    snap = tracemalloc.take_snapshot()
    by = collections.Counter()
    for st in snap.statistics("filename"):
        f = st.traceback[0].filename
        key = "torchscope" if "/torchscope/" in f else ("distributed" if "/distributed/" in f else ("dask" if "/dask/" in f else ("msgpack/pickle" if ("pickle" in f or "msgpack" in f) else f.rsplit("/",1)[-1])))
        by[key] += st.size
    s = dask_worker.state
    lines = [(st.traceback[0].filename.split("site-packages/")[-1] + ":" + str(st.traceback[0].lineno), st.size) for st in snap.statistics("lineno")[:top]]
    deep = []
    for st in snap.statistics("traceback")[:6]:
        deep.append([st.size, [f"{fr.filename.split('/')[-1]}:{fr.lineno}" for fr in st.traceback if "torchscope" in fr.filename or "fromnumeric" in fr.filename or "pathlib" in fr.filename or "profile.py" in fr.filename][:8]])
    return {"deep": deep, "rss_mb": round(rss(),1), "traced_mb": round(sum(by.values())/2**20,2), "by_mb": {k: round(v/2**20,2) for k,v in by.most_common(8)},
            "log": len(s.log), "stimulus_log": len(s.stimulus_log), "tasks": len(s.tasks), "data": len(dask_worker.data), "top": lines}

def run(n, folder):
    from distributed import Client, LocalCluster, as_completed
    ranks_scale.write_ranks(folder, n)
    groups = group_by_worker(discover_all([folder]).refs)
    analyses = all_analyses(None)
    import dask
    with dask.config.set({'distributed.worker.profile.enabled': os.environ.get('PROF','1')=='1'}):
      cl = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.CRITICAL)
    client = Client(cl)
    client.run(start)
    shared = client.scatter(list(analyses), broadcast=True)
    futures = [client.submit(C._extract_or_error, g, shared, False, i, pure=False) for i, g in enumerate(groups)]
    for f, v in as_completed(futures, with_results=True):
        f.release()
    del futures
    time.sleep(1)
    out = list(client.run(measure).values())[0]
    client.close(); cl.close()
    return out

if __name__ == "__main__":
    for n in map(int, sys.argv[1:]):
        print(n, json.dumps(run(n, Path(tempfile.mkdtemp()) / f"ranks{n}")), flush=True)
