"""What a click on a timeline event shows besides its name and times (analysis/timeline.py `details`):
every arg the trace tables keep, `title: value` a line, absent ones skipped, per-event ids left out."""

from __future__ import annotations

from pathlib import Path

from helpers.trace_builder import HOST_PID, HOST_TID, TraceBuilder

from torchscope.analysis.timeline import Timeline
from torchscope.pipeline.analyze import analyze_run

HOSTILE = "</script><img src=x onerror=alert(1)>"


def _details(tmp_path: Path) -> dict[str, str]:
    """The click text of each event of a small synthetic CUDA trace, by event name."""
    b = TraceBuilder().gpu()
    b.step(1, 0.0, 1000.0)
    b.op("aten::addmm", 10.0, 100.0, **{"Input Dims": [[8, 16], [16, 4]], "Input type": ["float", "float"],
                                        "Concrete Inputs": ["", "", "1"], "Call stack": f"train.py(3): {HOSTILE}"})
    b.launch(20.0, 5.0, 30.0, 50.0, name="gemm")  # grid, block, blocks per SM, occupancy, registers
    b.launch(120.0, 5.0, 130.0, 20.0, name="Memcpy HtoD", runtime="cudaMemcpyAsync", cat="gpu_memcpy",
             **{"bytes": 4096, "memory bandwidth (GB/s)": 12.3456})
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": HOST_PID, "tid": HOST_TID,
                     "ts": 300.0, "dur": 50.0, "args": {"External id": 99, "Collective name": "allreduce",
                     "Process Group Name": "0", "Group size": 2, "In msg nelems": 1024, "Out msg nelems": 1024,
                     "dtype": "Float", "Seq": 7}})  # fmt: skip
    run = analyze_run(b.write(tmp_path / "trace.json"), jobs=1, use_cache=False)
    lanes: Timeline = run.sidecars["timeline"]
    return {lanes.strings[lane.name[i]]: lanes.strings[lane.detail[i]] for lane in lanes.lanes for i in range(len(lane.name))}


def test_a_click_shows_every_kept_arg_and_no_per_event_id(tmp_path: Path) -> None:
    shown = _details(tmp_path)
    assert shown["aten::addmm"].split("\n") == [
        "shapes: [[8, 16], [16, 4]]", 'types: ["float", "float"]', 'concrete inputs: ["", "", "1"]', f"stack: train.py(3): {HOSTILE}",
    ]
    kernel = shown["gemm"].split("\n")
    assert kernel[:2] == ["grid: [128, 1, 1]", "block: [256, 1, 1]"]  # the JSON as the trace wrote it
    assert set(kernel[2:]) == {"registers per thread: 64", "blocks per SM: 1.2", "est. achieved occupancy %: 50"}
    assert shown["Memcpy HtoD"].split("\n") == ["bytes: 4096", "memory bandwidth (GB/s): 12.35"]
    assert shown["record_param_comms"].split("\n") == [
        "collective: allreduce", "process group: 0", "dtype: Float", "group size: 2", "in msg nelems: 1024", "out msg nelems: 1024",
    ]
    assert "99" not in shown["record_param_comms"] and "7" not in shown["record_param_comms"]  # External id, Seq
    assert shown["cudaLaunchKernel"] == "" and shown["ProfilerStep#1"] == ""
