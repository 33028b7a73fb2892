"""One measured case, run by `run.py` in a fresh process (so its peak RSS is its own).

    python benchmarks/_child.py MODE [--jobs N] [--profile FILE] PATH...

MODE is one of
  floor        read (gunzip when gzipped) + orjson.loads each file in turn: the floor for a JSON loader
  ts-load      torchscope.trace.parse.parse_trace on each file in turn (parse only, no cache)
  ts-analyze   torchscope.pipeline.analyze.analyze(PATH, jobs=N, use_cache=False): load + full analysis
  ts-cached    the same with use_cache=True (run twice: the first writes the cache, the second reads it)
  hta-load     hta.trace_analysis.TraceAnalysis(trace_dir=PATH): HTA's load (in the HTA venv)
Prints one line `BENCH-RESULT {json}` with the time of the operation itself (imports excluded) and a few
counts that show the work was done.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any, Callable


def floor(paths: list[str], jobs: int) -> dict[str, Any]:
    import gzip

    import orjson

    events = 0
    for path in paths:
        data = Path(path).read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = orjson.loads(data)
        del data
        events += len(doc["traceEvents"] if isinstance(doc, dict) else doc)
        del doc
    return {"events": events}


def ts_load(paths: list[str], jobs: int) -> dict[str, Any]:
    from torchscope.trace.parse import parse_trace

    events = 0
    for path in paths:
        trace = parse_trace(Path(path))
        events += len(trace.events)
        del trace
    return {"events": events}


def _analyze(paths: list[str], jobs: int, use_cache: bool) -> dict[str, Any]:
    from torchscope.pipeline.analyze import analyze

    target = paths[0] if len(paths) == 1 else paths
    report = analyze(target, jobs=jobs, use_cache=use_cache)
    return {"steps": len(report.steps), "ranks": len(report.run.ranks), "findings": len(report.findings),
            "mean_step_us": round(sum(s.duration_us for s in report.steps) / max(len(report.steps), 1), 3)}


def ts_analyze(paths: list[str], jobs: int) -> dict[str, Any]:
    return _analyze(paths, jobs, use_cache=False)


def ts_cached(paths: list[str], jobs: int) -> dict[str, Any]:
    return _analyze(paths, jobs, use_cache=True)


def hta_load(paths: list[str], jobs: int) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=paths[0])
    traces = analysis.t
    ranks = sorted(traces.traces) if hasattr(traces, "traces") else []
    rows = sum(len(traces.get_trace(r)) for r in ranks) if ranks else -1
    return {"ranks": len(ranks), "rows": rows}


MODES: dict[str, Callable[[list[str], int], dict[str, Any]]] = {
    "floor": floor, "ts-load": ts_load, "ts-analyze": ts_analyze, "ts-cached": ts_cached, "hta-load": hta_load,
}
_IMPORTS = {"floor": "orjson", "ts-load": "torchscope.trace.parse", "ts-analyze": "torchscope.pipeline.analyze",
            "ts-cached": "torchscope.pipeline.analyze", "hta-load": "hta.trace_analysis"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--profile", help="write cProfile's top entries here")
    args = parser.parse_args()
    started = time.perf_counter()
    __import__(_IMPORTS[args.mode])
    imported = time.perf_counter()
    run = MODES[args.mode]
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        detail = run(args.paths, args.jobs)
        profiler.disable()
        _write_profile(profiler, args.profile)
    else:
        detail = run(args.paths, args.jobs)
    finished = time.perf_counter()
    gc.collect()
    result = {"import_s": round(imported - started, 4), "op_s": round(finished - imported, 4), **detail}
    print("BENCH-RESULT " + json.dumps(result), flush=True)
    return 0


def _write_profile(profiler: cProfile.Profile, path: str) -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.strip_dirs()
    out.write("== by own time (tottime) ==\n")
    stats.sort_stats("tottime").print_stats(25)
    out.write("\n== by cumulative time ==\n")
    stats.sort_stats("cumulative").print_stats(35)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(out.getvalue())


if __name__ == "__main__":
    sys.exit(main())
