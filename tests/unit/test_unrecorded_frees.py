"""Frees the trace lacks (analysis/memory_blocks.py): a block allocated again at an address the trace still
holds was freed on a thread the profiler does not follow. Where the allocated total counts recorded events
only (c10's CPU allocator) the leak rule judges the line without the never-freed blocks perhaps freed
unseen (of such a size, or a collective's buffer), and says when that leaves no leak
(trace_quality.unrecorded_frees); where the allocator counts itself (CUDA's) the line stands, and only the
blocks' call sites are in doubt. Shared-memory blocks (DataLoader workers) are no part of the CPU total."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import torchscope
from helpers.trace_builder import TraceBuilder
from test_memory_analysis import Allocator
from torchscope.analysis.memory_blocks import (
    DeviceMemory, counts_recorded_events_only, pair_blocks, possibly_freed_unseen, without_unrecorded_frees,
)
from torchscope.report.model import Report

MIB = 1024 * 1024
STEP_US = 1000.0
CAPTURE = Path(__file__).resolve().parents[1] / "data" / "captures" / "fsdp2_gloo_cpu"


def _device(nbytes: list[int], addr: list[int], allocated: list[int] | None = None) -> DeviceMemory:
    sizes = np.array(nbytes)
    totals = np.cumsum(sizes) if allocated is None else np.array(allocated)
    return DeviceMemory(np.arange(sizes.size), np.arange(sizes.size, dtype=float), sizes, totals, None, np.array(addr))


def test_an_address_allocated_again_while_held_shows_a_free_the_trace_lacks() -> None:
    # addr 7: allocated (0), allocated again (2) with no free between, freed (3); addr 8: allocated, freed.
    memory = _device([10, 4, 10, -10, -4], [7, 8, 7, 7, 8])
    blocks = pair_blocks(memory)
    assert blocks.alloc.tolist() == [0, 1, 2] and blocks.free.tolist() == [2, 4, 3]
    assert blocks.unrecorded.tolist() == [True, False, False] and blocks.orphan_frees == 0
    assert blocks.alive_at(1).tolist() == [True, True, False] and blocks.alive_at(2).tolist() == [False, True, True]


def test_totals_that_count_recorded_events_only_drop_by_the_lost_blocks() -> None:
    """c10's CPU allocator: the total is the running sum of the events, and a free it never reported
    stays in it; the block is taken off from the allocation that shows it gone on."""
    memory = _device([10, 4, 10, -10, -4], [7, 8, 7, 7, 8])
    assert counts_recorded_events_only(memory)
    assert memory.allocated.tolist() == [10, 14, 24, 14, 10]
    corrected, unseen = without_unrecorded_frees(memory, pair_blocks(memory))
    assert corrected.allocated.tolist() == [10, 14, 14, 4, 0] and unseen.tolist() == [0, 0, 10, 0, 0]
    # CUDA's caching allocator counts every free, reported or not: its total already dropped (a jump).
    counted = _device([10, 4, 10, -10, -4], [7, 8, 7, 7, 8], allocated=[10, 14, 14, 4, 0])
    assert not counts_recorded_events_only(counted)
    assert without_unrecorded_frees(counted, pair_blocks(counted))[0] is counted


def test_never_freed_blocks_of_a_lost_size_or_from_a_collective_are_in_doubt() -> None:
    # 1 MiB at addr 1 allocated twice (a lost free), 1 MiB at addr 2, 4 bytes at addr 3 and 8 bytes at
    # addr 4 (inside a collective) never freed.
    memory = _device([MIB, MIB, MIB, 4, 8], [1, 1, 2, 3, 4])
    blocks = pair_blocks(memory)
    assert blocks.unrecorded.tolist() == [True, False, False, False, False]
    collective = np.array([False, False, False, False, True])
    assert possibly_freed_unseen(memory, blocks, collective).tolist() == [False, True, True, False, True]


def _collective_buffers(tmp_path: Path, cpu: bool, leak: int = 0) -> Report:
    """Eight steps; each allocates a 3 MiB buffer at a new address whose free goes unrecorded (a
    collective's, released on the backend's thread), and in step 3 one at an address still held. On the
    CPU the total counts only recorded events; on CUDA the allocator's total drops for the lost frees
    (the buffer is gone by the next step). `leak`: bytes kept each step by `aten::ones` besides."""
    b = TraceBuilder() if cpu else TraceBuilder().gpu()
    mem = Allocator(b, device_type=0 if cpu else 1, device_id=-1 if cpu else 0)
    for i in range(8):
        t0 = 100.0 + i * STEP_US
        b.step(i + 5, t0, STEP_US - 10)
        b.op("c10d::_reduce_scatter_base_", t0 + 100, 100)
        for addr in [2000 if i == 3 else 1000 + i] + ([2000] if i == 2 else []):
            mem.alloc(t0 + 110, addr=addr, nbytes=3 * MIB)
            if not cpu:
                mem.allocated -= 3 * MIB  # the allocator's own count: freed unseen, before the next event
        b.op("aten::mul", t0 + 300, 100)
        mem.alloc(t0 + 310, addr=5000, nbytes=MIB)
        mem.free(t0 + 390, addr=5000)
        if leak:
            b.op("aten::ones", t0 + 500, 50)
            mem.alloc(t0 + 510, addr=9000 + i, nbytes=leak)
    return torchscope.analyze(b.write(tmp_path / f"t{cpu}{leak}.json"), jobs=1, use_cache=False)


def test_on_the_cpu_the_growth_of_lost_frees_gets_no_leak_verdict(tmp_path: Path) -> None:
    report = _collective_buffers(tmp_path, cpu=True)
    ids = [f.id for f in report.findings]
    assert "memory.leak" not in ids
    [quality] = [f for f in report.findings if f.id == "trace_quality.unrecorded_frees"]
    assert quality.severity == "info" and quality.time_share is None
    assert quality.title.startswith("Memory on cpu seems to grow by 3.0 MiB every step, but the trace misses frees")
    assert quality.evidence["doubtful_bytes_per_step"] == 3 * MIB and quality.evidence["growth_without_them_bytes_per_step"] == 0
    assert [fix.target for fix in quality.fixes] == ["memory check without the profiler"]
    fit = report.memory.growth["cpu"]
    assert fit.unrecorded_frees == 1 and fit.surviving_by_call_site == {}
    assert (fit.bytes_per_step, fit.leak_bytes_per_step) == (3 * MIB, 0)
    assert report.measurements.memory.unrecorded_frees_per_step == {"cpu": 1 / 8}
    # Nine buffers and the temporary, less the block shown gone by the allocation at its address.
    assert report.memory.peak_allocated_bytes["cpu"] == (9 * 3 + 1 - 3) * MIB
    # Each step's rows balance: the free the trace lacked counts in the step whose allocation shows it.
    for row in report.memory.per_step:
        assert row.allocated_at_end_bytes - row.allocated_at_start_bytes == row.alloc_bytes - row.free_bytes
    assert [row.free_count for row in report.memory.per_step] == [1, 1, 2, 1, 1, 1, 1, 1]


def test_a_leak_beside_lost_frees_on_the_cpu_is_still_a_leak(tmp_path: Path) -> None:
    """One lost free does not hide a leak: the line without the doubtful blocks still rises 2 MiB a step."""
    report = _collective_buffers(tmp_path, cpu=True, leak=2 * MIB)
    assert "trace_quality.unrecorded_frees" not in [f.id for f in report.findings]
    [leak] = [f for f in report.findings if f.id == "memory.leak"]
    assert leak.severity == "warning" and leak.evidence["growth_bytes_per_step"] == 2 * MIB
    assert leak.evidence["recorded_growth_bytes_per_step"] == 5 * MIB and leak.evidence["doubtful_bytes_per_step"] == 3 * MIB
    assert list(leak.evidence["surviving_bytes_per_step_by_call_site"].values()) == [2 * MIB]
    assert "recorded total rises 5.0 MiB per step; 2.0 MiB of it is left" in leak.recommendation


def test_collective_buffers_never_freed_are_in_doubt_without_a_lost_free(tmp_path: Path) -> None:
    """No address allocated again (the allocator did not reuse one): a collective's never-freed buffers
    still do not make a leak, and the finding says why without claiming a lost free."""
    b = TraceBuilder()
    mem = Allocator(b, device_type=0, device_id=-1)
    for i in range(6):
        t0 = 100.0 + i * STEP_US
        b.step(i + 5, t0, STEP_US - 10)
        b.op("c10d::_reduce_scatter_base_", t0 + 100, 100)
        b.op("aten::clone", t0 + 105, 50)
        mem.alloc(t0 + 110, addr=1000 + i, nbytes=3 * MIB)
    report = torchscope.analyze(b.write(tmp_path / "t.json"), jobs=1, use_cache=False)
    assert "memory.leak" not in [f.id for f in report.findings]
    [quality] = [f for f in report.findings if f.id == "trace_quality.unrecorded_frees"]
    assert "the growth is collectives' buffers the trace never saw freed" in quality.title
    assert report.memory.growth["cpu"].unrecorded_frees == 0 and report.memory.growth["cpu"].doubtful_bytes_per_step == 3 * MIB


def test_shared_memory_blocks_are_no_part_of_the_cpu_total(tmp_path: Path) -> None:
    """Tensors from DataLoader workers come as shared-memory blocks reported with `Total Allocated` 0 on
    the CPU; read as the total they broke every step boundary (-64 KiB) and hid a 4 MiB a step leak."""
    b = TraceBuilder()
    mem = Allocator(b, device_type=0, device_id=-1)
    for i in range(6):
        t0 = 100.0 + i * STEP_US
        b.step(i + 5, t0, STEP_US - 10)
        for addr, nbytes in ((7000 + i, 65536), (8000 + i, 512)):  # the batch, then its previous one freed
            b.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1000, "tid": 1000, "ts": t0 + 1,
                             "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": 0, "Total Reserved": nbytes,
                                      "Device Type": 0, "Device Id": -1}})  # fmt: skip
            b.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": 1000, "tid": 1000, "ts": t0 + 2,
                             "args": {"Addr": addr - 100, "Bytes": -nbytes, "Total Allocated": 0, "Total Reserved": 0,
                                      "Device Type": 0, "Device Id": -1}})  # fmt: skip
        b.op("aten::ones", t0 + 300, 50)
        mem.alloc(t0 + 310, addr=9000 + i, nbytes=4 * MIB)
    report = torchscope.analyze(b.write(tmp_path / "t.json"), jobs=1, use_cache=False)
    assert report.memory.growth["cpu"].bytes_per_step == 4 * MIB
    assert min(row.allocated_at_start_bytes for row in report.memory.per_step) >= 0
    assert "memory.leak" in [f.id for f in report.findings]


def test_on_cuda_the_allocators_own_total_keeps_the_leak_verdict(tmp_path: Path) -> None:
    """CUDA's total drops for the frees the trace lacks: no growth from the buffers, and a real leak is
    still one, named by its own blocks (the buffers' size is left out of the sites)."""
    report = _collective_buffers(tmp_path, cpu=False)
    assert not {"memory.leak", "trace_quality.unrecorded_frees"} & {f.id for f in report.findings}
    fit = report.memory.growth["cuda:0"]
    assert fit.unrecorded_frees == 1 and fit.bytes_per_step == fit.leak_bytes_per_step == 0.0
    report = _collective_buffers(tmp_path, cpu=False, leak=2 * MIB)
    [leak] = [f for f in report.findings if f.id == "memory.leak"]
    assert leak.evidence["growth_bytes_per_step"] == 2 * MIB
    assert list(leak.evidence["surviving_bytes_per_step_by_call_site"].values()) == [2 * MIB]
    assert "trace_quality.unrecorded_frees" not in [f.id for f in report.findings]


def test_a_real_fsdp2_capture_on_gloo_is_no_leak() -> None:
    """tests/data/captures/fsdp2_gloo_cpu/README.md: the recorded total rises ~3 MiB a step while the
    process's memory does not; before, this read as memory.leak, a warning."""
    report = torchscope.analyze(CAPTURE, jobs=1, use_cache=False)
    ids = [f.id for f in report.findings]
    assert "memory.leak" not in ids and "trace_quality.unrecorded_frees" in ids
    fit = report.memory.growth["cpu"]
    assert fit.unrecorded_frees >= 1 and fit.bytes_per_step > MIB and fit.leak_bytes_per_step < 0.1 * MIB
    assert fit.doubtful_bytes_per_step >= 0.9 * fit.bytes_per_step  # the buffers perhaps freed unseen explain it
    assert sum(fit.surviving_by_call_site.values()) < 64 * 1024
    # FSDP2's forward ranges name the wrapper: the communication advice is FSDP's, not DDP's buckets.
    assert report.measurements.data_parallel.wrapper == "fully_shard"
    comm = next(f for f in report.findings if f.id == "communication.share")
    assert [fix.target for fix in comm.fixes] == ["FSDPModule.set_modules_to_forward_prefetch", "fully_shard.reshard_after_forward"]
