"""The kernel table's per-name figures on a built GPU trace: the op that launched most of a kernel's calls
(the first interned name among ties), tensor-core flags, calls and times."""

from __future__ import annotations

import json

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.span import SpanInput
from torchscope.trace.parse import parse_trace_bytes
from torchscope.trace.tables import TraceFile


def _launches(builder: TraceBuilder, op: str, kernel: str, t: float, count: int) -> float:
    for _ in range(count):
        builder.op(op, t, 10)
        builder.launch(t + 1, 5, t + 20, 4, name=kernel)
        t += 50
    return t


def test_kernel_rows_launched_by_tensor_core_and_totals() -> None:
    builder = TraceBuilder().gpu()
    builder.step(1, 0, 2000)
    t = _launches(builder, "aten::add", "elementwise_kernel", 10, 2)  # interned before aten::mm: wins the tie
    t = _launches(builder, "aten::mm", "elementwise_kernel", t, 2)
    t = _launches(builder, "aten::mm", "ampere_sgemm_128x64_tn_hmma", t, 3)
    t = _launches(builder, "aten::add", "reduce_kernel", t, 1)
    t = _launches(builder, "aten::mm", "reduce_kernel", t, 3)  # the majority, though interned later
    builder.launch(t, 5, t + 20, 4, name="orphan_kernel")  # launched outside any op
    table = parse_trace_bytes(json.dumps(builder.document()).encode())
    span = SpanInput(TraceFile("built.json", table.header, table.events))
    rows = {row.name: row for row in span.device.kernel_rows}
    assert rows["elementwise_kernel"].launched_by == "aten::add" and rows["elementwise_kernel"].calls == 4
    assert rows["ampere_sgemm_128x64_tn_hmma"].launched_by == "aten::mm"
    assert rows["reduce_kernel"].launched_by == "aten::mm"
    assert rows["ampere_sgemm_128x64_tn_hmma"].tensor_core and not rows["elementwise_kernel"].tensor_core
    assert rows["orphan_kernel"].launched_by == "" and rows["orphan_kernel"].calls == 1
    assert rows["ampere_sgemm_128x64_tn_hmma"].total_us == 12.0


def test_device_kind_from_hip_runtime_calls() -> None:
    """Without a device name in the header, HIP runtime calls say ROCm; CUDA ones, CUDA."""
    from torchscope.analysis.span_meta import extract_meta

    kinds = []
    for runtime in ("hipLaunchKernel", "cudaLaunchKernel"):
        builder = TraceBuilder()
        builder.step(1, 0, 200)
        builder.op("aten::mm", 10, 20)
        builder.launch(11, 5, 40, 10, runtime=runtime)
        table = parse_trace_bytes(json.dumps(builder.document()).encode())
        kinds.append(extract_meta(SpanInput(TraceFile("built.json", table.header, table.events))).device_kind)
    assert kinds == ["rocm", "cuda"]
