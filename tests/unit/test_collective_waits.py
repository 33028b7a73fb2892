"""With stacks, a caller's wait for a collective (c10d's `Work.wait()` called from torch.distributed) is
communication: gloo runs the collective on its own threads while the caller waits outside the `c10d::`
op's range (Lightning's per-step SIGTERM broadcast under DDP read as work outside the phases)."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope
from helpers.trace_builder import HOST_TID, TraceBuilder

WAIT = "<built-in method wait of pybind11_builtins.pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1 object at 0x7f00>"


def test_a_wait_torch_distributed_makes_is_communication(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 10_000
        b.step(i, t0, 10_000)
        b.op("lightning/pytorch/loops/training_epoch_loop.py(259): _broadcast_sigterm_tensor", t0 + 100, 1_200, cat="python_function")
        b.op("torch/distributed/distributed_c10d.py(3085): broadcast", t0 + 150, 1_100, cat="python_function")
        b.op("c10d::broadcast_", t0 + 200, 100)
        b.op(WAIT, t0 + 400, 800, cat="python_function")
        b.op("train.py(40): metrics", t0 + 2_000, 600, cat="python_function")
        b.op(WAIT, t0 + 2_100, 400, cat="python_function")  # some other C++ object's wait: not a collective's
        b.op("aten::mm", t0 + 5_000, 3_000)
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert report.phases["communication"].us == pytest.approx(100 + 800)  # the c10d op and the wait it made
    assert report.phases["other"].us >= 600  # the metrics call and its wait stay outside the phases


def test_a_background_threads_wait_is_not_the_loops_communication(tmp_path: Path) -> None:
    """A daemon thread blocked in a heartbeat broadcast while the loop runs its forward: the forward stays."""
    b = TraceBuilder()
    for i in range(3):
        t0 = i * 10_000
        b.step(i, t0, 10_000)
        b.op("aten::mm", t0 + 100, 6_000)
        b.op("torch/distributed/distributed_c10d.py(3085): broadcast", t0, 9_000, cat="python_function", tid=HOST_TID + 1)
        b.op(WAIT, t0 + 50, 8_900, cat="python_function", tid=HOST_TID + 1)
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert report.phases["communication"].us == 0.0
