"""What this CPU can do, measured at the end of a CPU capture: a short float32 matmul and a large copy,
on the threads the script left torch with, and whether its bfloat16/float16 matmuls have fast kernels. The
roofline of a CPU run compares its operators with these figures (a CPU has no datasheet peak that torch
reaches: vector width, turbo, threads and the memory system all decide it).

Costs about 0.2 s (0.5 s where half precision falls back to scalar code), once, after the profiled window
has closed and only when the capture completed, so it never runs inside the user's training or delays a
Ctrl-C. Uses torch.ones (no random numbers), under
no_grad, and frees what it allocated.
"""

from __future__ import annotations

import time
from typing import Any

MATMUL_N = 512  # 2 x 512^3 = 0.27 GFLOP a call: a few ms on a laptop core, large enough to be compute-bound
# Half precision against float32 at one small size: a CPU without oneDNN's bfloat16/float16 kernels (AVX2
# machines) runs them in ATen's scalar fallback, tens of times slower (measured: 0.5 against 38.7 GFLOP/s), so
# a small size keeps that case to ~25 ms a call. Other processes on the cores slow float32's threads far more
# than the fallback (ratios 0.01 quiet, 0.6 loaded): the kernels' presence is the verdict, the ratio evidence.
HALF_N = 256
HALF_SECONDS = 0.05
COPY_BYTES = 64 << 20  # larger than any last-level cache, so the copy measures memory bandwidth
MATMUL_SECONDS = 0.12
COPY_SECONDS = 0.06


def measure_cpu_peak(torch: Any) -> dict[str, Any] | None:
    """{matmul_gflops, copy_gbps, threads, method} from the best of short repeated runs (None if torch
    fails, e.g. an exotic build)."""
    try:
        with torch.no_grad():
            a = torch.ones(MATMUL_N, MATMUL_N)
            b = torch.ones(MATMUL_N, MATMUL_N)
            out = torch.empty(MATMUL_N, MATMUL_N)
            torch.mm(a, b, out=out)  # warm-up: thread pool and kernel selection
            matmul = _best_rate(lambda: torch.mm(a, b, out=out), 2.0 * MATMUL_N**3, MATMUL_SECONDS)
            source = torch.ones(COPY_BYTES // 4)
            target = torch.empty_like(source)
            target.copy_(source)
            copy = _best_rate(lambda: target.copy_(source), 2.0 * COPY_BYTES, COPY_SECONDS)  # read + write
            threads = int(torch.get_num_threads())
        del a, b, out, source, target
    except Exception:  # never cost the manifest
        return None
    return {
        "matmul_gflops": matmul / 1e9,
        "copy_gbps": copy / 1e9,
        "threads": threads,
        "method": f"best of repeated float32 {MATMUL_N}x{MATMUL_N} matmuls and {COPY_BYTES >> 20} MiB copies at capture end",
        **_half_speeds(torch),
    }


def _half_speeds(torch: Any) -> dict[str, Any]:
    """`{bfloat16_native, float16_native}`: whether oneDNN has the dtype's kernels on this CPU (what ATen's CPU
    matmuls use for it: `torch.ops.mkldnn._is_mkldnn_bf16_supported()`), and `{bfloat16_matmul_speed,
    float16_matmul_speed}`: each dtype's matmul rate over float32's at `HALF_N` (below 1: slower); what this
    build cannot tell or multiply is left out."""
    speeds: dict[str, Any] = {}
    for name, check in (("bfloat16", "_is_mkldnn_bf16_supported"), ("float16", "_is_mkldnn_fp16_supported")):
        try:
            speeds[f"{name}_native"] = bool(getattr(torch.ops.mkldnn, check)())
        except Exception:  # a build without oneDNN, or without the check
            continue
    try:
        with torch.no_grad():
            reference = _matmul_rate(torch, torch.float32)
            for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
                try:
                    speeds[f"{name}_matmul_speed"] = _matmul_rate(torch, dtype) / reference
                except Exception:  # no CPU kernel for the dtype in this build
                    continue
    except Exception:
        return {}
    return speeds


def _matmul_rate(torch: Any, dtype: Any) -> float:
    a = torch.ones(HALF_N, HALF_N, dtype=dtype)
    out = torch.empty(HALF_N, HALF_N, dtype=dtype)
    torch.mm(a, a, out=out)  # warm-up: kernel selection
    return _best_rate(lambda: torch.mm(a, a, out=out), 2.0 * HALF_N**3, HALF_SECONDS)


def _best_rate(call: Any, work: float, seconds: float) -> float:
    """The highest work per second over repeated calls within `seconds` (the fastest call is the one
    least disturbed by other processes)."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    calls = 0
    while calls < 3 or time.perf_counter() < deadline:
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
        calls += 1
        if calls >= 1000:
            break
    return work / best if best > 0 else 0.0
