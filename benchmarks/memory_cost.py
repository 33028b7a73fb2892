"""What the memory analysis (analysis/memory.py) adds to the analysis of one trace.

    python benchmarks/memory_cost.py benchmarks/data/50mb/rank0.*.pt.trace.json [--repeat 3]

Parses the trace once, then times, on a fresh `SpanInput` each repeat: every built-in analysis's
extract except memory (in catalogue order, so the shared step windows, call tree and phases are built
there), then the memory extract on the same SpanInput (its own work only), and, separately, the memory
extract alone on a fresh SpanInput (its work plus the shared pieces it needs). The fastest repeat of each
is printed beside the parse time, as a share of the analysis (extracts) and of load+analysis.
With `--pipeline`, also `torchscope.analyze(trace, jobs=1, use_cache=False)` end to end with and
without the memory analysis, alternating, fastest of `--repeat` each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from torchscope.analysis.catalogue import all_analyses
from torchscope.analysis.memory import MEMORY
from torchscope.analysis.span import SpanInput
from torchscope.trace.load import load_trace_file
from torchscope.trace.kinds import Kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pipeline", action="store_true", help="also time analyze() with and without memory")
    args = parser.parse_args()
    if args.pipeline:
        pipeline(args.trace, args.repeat)
    start = time.perf_counter()
    trace = load_trace_file(args.trace, use_cache=False)
    parse_s = time.perf_counter() - start
    others = [a for a in all_analyses(sidecars=()) if a.name != MEMORY.name]
    rest, mine, alone = [], [], []
    for _ in range(args.repeat):
        span = SpanInput(trace)
        t0 = time.perf_counter()
        for analysis in others:
            analysis.extract(span)
        t1 = time.perf_counter()
        MEMORY.extract(span)
        t2 = time.perf_counter()
        rest.append(t1 - t0)
        mine.append(t2 - t1)
        fresh = SpanInput(trace)
        t3 = time.perf_counter()
        MEMORY.extract(fresh)
        alone.append(time.perf_counter() - t3)
    events = len(trace.events)
    memory_events = int(np.count_nonzero(trace.events.kind == Kind.MEMORY))
    r, m, a = min(rest), min(mine), min(alone)
    print(f"{args.trace}: {events:,} events, {memory_events:,} [memory] events")
    print(f"parse {parse_s:.2f} s; other analyses {r:.2f} s; memory after them {m:.3f} s; memory alone {a:.3f} s")
    print(f"memory adds {100 * m / r:.1f} % to the analysis and {100 * m / (r + parse_s):.1f} % to load+analysis "
          f"(alone, with the shared pieces it builds: {100 * a / r:.1f} % / {100 * a / (r + parse_s):.1f} %)")


def pipeline(trace: Path, repeat: int) -> None:
    import torchscope
    from torchscope.analysis import catalogue

    with_memory = catalogue.BUILTIN
    without = tuple(a for a in with_memory if a.name != MEMORY.name)
    times: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(repeat):
        for label, builtin in (("without", without), ("with", with_memory)):
            catalogue.BUILTIN = builtin
            start = time.perf_counter()
            torchscope.analyze(trace, jobs=1, use_cache=False)
            times[label].append(time.perf_counter() - start)
    catalogue.BUILTIN = with_memory
    a, b = min(times["without"]), min(times["with"])
    print(f"analyze() end to end: without memory {a:.2f} s, with {b:.2f} s: +{100 * (b - a) / a:.1f} %")


if __name__ == "__main__":
    main()
