"""Build small synthetic Kineto traces for tests (GPU cases included).

Events are written the way PyTorch 2.x's Kineto writes them: `cpu_op`/`user_annotation` ranges on a host
thread, `cuda_runtime` launches with a `correlation` id, `kernel`/`gpu_memcpy`/`gpu_memset` on a stream
with the same `correlation`, and `ac2g` flow events linking the two.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST_PID = 1000
HOST_TID = 1000


@dataclass
class TraceBuilder:
    events: list[dict[str, Any]] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=lambda: {"schemaVersion": 1})
    _correlation: int = 1
    _external: int = 1
    _addr: int = 0

    def gpu(self, name: str = "NVIDIA A100-SXM4-80GB", major: int = 8, minor: int = 0, memory: int = 80 * 2**30) -> "TraceBuilder":
        self.header["deviceProperties"] = [
            {"id": 0, "name": name, "totalGlobalMem": memory, "computeMajor": major, "computeMinor": minor, "numSms": 108}
        ]
        return self

    def rank(self, rank: int, world_size: int) -> "TraceBuilder":
        self.header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
        return self

    def op(self, name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = HOST_TID, **args: Any) -> int:
        external = self._external
        self._external += 1
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": tid, "ts": ts, "dur": dur,
             "args": {"External id": external, **args}}
        )
        return external

    def annotation(self, name: str, ts: float, dur: float, tid: int = HOST_TID) -> None:
        self.op(name, ts, dur, cat="user_annotation", tid=tid)

    def step(self, number: int, ts: float, dur: float) -> None:
        self.annotation(f"ProfilerStep#{number}", ts, dur)

    def launch(
        self, ts: float, dur: float, device_ts: float, device_dur: float, name: str = "void gemm_kernel()",
        runtime: str = "cudaLaunchKernel", cat: str = "kernel", stream: int = 7, **device_args: Any,
    ) -> int:
        """A runtime call on the host and the device op it starts, linked by correlation id."""
        correlation = self._correlation
        self._correlation += 1
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": runtime, "pid": HOST_PID, "tid": HOST_TID, "ts": ts,
             "dur": dur, "args": {"correlation": correlation, "External id": 0}}
        )
        args = {"device": 0, "stream": stream, "correlation": correlation, "External id": 0}
        if cat == "kernel":
            args.update({"grid": [128, 1, 1], "block": [256, 1, 1], "blocks per SM": 1.2, "warps per SM": 9.6,
                         "registers per thread": 64, "shared memory": 0, "est. achieved occupancy %": 50})
        args.update(device_args)
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": device_ts, "dur": device_dur, "args": args}
        )
        self.events.append({"ph": "s", "id": correlation, "pid": HOST_PID, "tid": HOST_TID, "ts": ts, "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": device_ts, "cat": "ac2g", "name": "ac2g", "bp": "e"})
        return correlation

    def runtime(self, name: str, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": HOST_PID, "tid": HOST_TID, "ts": ts, "dur": dur, "args": {"correlation": self._next_correlation()}})

    def memory(self, ts: float, allocated: int, reserved: int, device_type: int = 1, device_id: int = 0, delta: int = 0) -> None:
        """A `[memory]` event with the given totals, at an address of its own (nothing pairs: blocks are
        tests/unit/test_memory_analysis.py's `Allocator`)."""
        self._addr += 1
        self.events.append(
            {"ph": "i", "s": "t", "name": "[memory]", "pid": HOST_PID, "tid": HOST_TID, "ts": ts,
             "args": {"Addr": self._addr, "Bytes": delta, "Total Allocated": allocated, "Total Reserved": reserved,
                      "Device Type": device_type, "Device Id": device_id}}
        )

    def _next_correlation(self) -> int:
        value = self._correlation
        self._correlation += 1
        return value

    def document(self) -> dict[str, Any]:
        return {**self.header, "traceEvents": self.events}

    def write(self, path: Path, compress: bool = False) -> Path:
        data = json.dumps(self.document()).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data) if compress else data)
        return path
