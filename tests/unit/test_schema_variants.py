"""Schema tolerance: the Kineto trace variants PyTorch 1.8-2.x, CUDA, ROCm and CPU-only produce."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.trace.kinds import Kind
from torchscope.trace.parse import parse_trace_bytes


def _events(doc: object) -> bytes:
    return json.dumps(doc).encode()


def _gpu_trace() -> TraceBuilder:
    b = TraceBuilder().gpu()
    b.step(1, 0, 1000)
    b.op("aten::mm", 10, 100)
    b.launch(20, 10, 40, 500)
    return b


def test_bare_array_without_wrapper() -> None:
    trace = parse_trace_bytes(_events(_gpu_trace().events))
    assert trace.header == {}
    assert int((trace.events.kind == Kind.KERNEL).sum()) == 1


@pytest.mark.parametrize(
    ("old", "new", "kind"),
    [("Kernel", "kernel", Kind.KERNEL), ("Runtime", "cuda_runtime", Kind.RUNTIME), ("Memcpy", "gpu_memcpy", Kind.MEMCPY),
     ("Memset", "gpu_memset", Kind.MEMSET), ("Operator", "cpu_op", Kind.CPU_OP), ("xpu_runtime", "privateuse1_runtime", Kind.RUNTIME)],
)
def test_old_and_new_category_names(old: str, new: str, kind: Kind) -> None:
    for cat in (old, new):
        doc = [{"ph": "X", "cat": cat, "name": "x", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]
        assert parse_trace_bytes(_events(doc)).events.kind.tolist() == [kind]


def test_string_pids_and_tids_and_device_streams() -> None:
    doc = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Traces", "tid": "PyTorch Profiler", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 1, "dur": 2, "args": {"external id": 5, "correlation": 9}},
        {"ph": "X", "cat": "Operator", "name": "aten::add", "pid": 12, "tid": "12", "ts": 1, "dur": 2, "args": {"External id": 5}},
    ]
    events = parse_trace_bytes(_events(doc)).events
    assert events.text(events.pid) == ["Traces", "0", "12"]
    assert events.text(events.tid) == ["PyTorch Profiler", "stream 7", "12"]
    # PyTorch <= 1.10 wrote "external id" on device events: it lands in the same column.
    assert events.external_id.tolist() == [-1, 5, 5]
    assert events.kind.tolist() == [Kind.TRACE_SPAN, Kind.KERNEL, Kind.CPU_OP]


def test_nanosecond_resolution_timestamps_are_kept() -> None:
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5737340929431.619, "dur": 0.381}],
           "displayTimeUnit": "ns", "baseTimeNanoseconds": 1711964646000000000}
    trace = parse_trace_bytes(_events(doc))
    assert trace.events.ts_us[0] == pytest.approx(5737340929431.619, abs=1e-3)
    assert trace.events.dur_us[0] == pytest.approx(0.381)
    assert trace.header["baseTimeNanoseconds"] == 1711964646000000000


def test_missing_optional_fields_get_defaults() -> None:
    doc = [{"ph": "X", "name": "a", "ts": 1}, {"ph": "i", "name": "[memory]", "ts": 2, "args": {"Bytes": 4}}]
    events = parse_trace_bytes(_events(doc)).events
    assert events.dur_us.tolist() == [0.0, 0.0]
    assert events.kind.tolist() == [Kind.OTHER, Kind.MEMORY]
    assert events.mem_bytes.tolist() == [0, 4]
    assert events.total_allocated.tolist() == [-1, -1]


def test_unknown_categories_are_kept() -> None:
    doc = [{"ph": "X", "cat": "mtia_ccp_events", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},
           {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]
    events = parse_trace_bytes(_events(doc)).events
    assert len(events) == 2 and events.text(events.cat) == ["mtia_ccp_events", "cpu_op"]


def test_kernel_args_become_columns() -> None:
    trace = parse_trace_bytes(_events(_gpu_trace().document()))
    e = trace.events
    k = np.flatnonzero(e.kind == Kind.KERNEL)[0]
    assert (e.stream[k], e.device[k], e.registers_per_thread[k], e.blocks_per_sm[k], e.occupancy_pct[k]) == (7, 0, 64, 1.2, 50)
    assert e.strings[e.grid[k]] == "[128, 1, 1]"
    runtime = np.flatnonzero(e.kind == Kind.RUNTIME)[0]
    assert e.correlation[runtime] == e.correlation[k] == 1


def test_wrong_typed_args_are_coerced_or_dropped_not_fatal() -> None:
    doc = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": "2",
            "args": {"correlation": "12", "stream": [1], "grid": [1, 1, 1]}}]
    trace = parse_trace_bytes(_events(doc))
    e = trace.events
    assert e.dur_us.tolist() == [2.0] and e.correlation.tolist() == [12] and e.stream.tolist() == [-1]


def test_memory_events_and_flows() -> None:
    b = _gpu_trace()
    b.memory(5, allocated=1024, reserved=2048)
    e = parse_trace_bytes(_events(b.document())).events
    mem = np.flatnonzero(e.kind == Kind.MEMORY)[0]
    assert (e.total_allocated[mem], e.total_reserved[mem], e.device_type[mem]) == (1024, 2048, 1)
    flows = np.flatnonzero(e.kind == Kind.FLOW)
    assert e.flow_id[flows].tolist() == [1, 1]
