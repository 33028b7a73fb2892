"""Memory analysis (analysis/memory*.py) on synthetic traces: blocks paired by address, the peak and
who holds it, churn and growth per step, old traces without `Addr`/totals, allocator calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import torchscope
from helpers.trace_builder import HOST_PID, HOST_TID, TraceBuilder
from torchscope.analysis.memory_blocks import DeviceMemory, memory_events, pair_blocks
from torchscope.analysis.memory_steps import StepTraffic, growth
from torchscope.report.model import Report
from torchscope.trace.load import load_trace_file

MIB = 1024 * 1024
STEP_US = 1000.0


class Allocator:
    """Writes `[memory]` events as Kineto does, keeping the running totals."""

    def __init__(self, builder: TraceBuilder, device_type: int = 1, device_id: int = 0, tid: Any = HOST_TID) -> None:
        self.b, self.device_type, self.device_id, self.tid = builder, device_type, device_id, tid
        self.allocated = 0
        self.sizes: dict[int, int] = {}

    def event(self, ts: float, addr: int, nbytes: int, **drop: bool) -> None:
        self.allocated += nbytes
        args = {"Addr": addr, "Bytes": nbytes, "Total Allocated": self.allocated, "Total Reserved": 2 * self.allocated + 64 * MIB,
                "Device Type": self.device_type, "Device Id": self.device_id}  # fmt: skip
        for key in [k for k, v in drop.items() if v]:
            args.pop({"no_addr": "Addr", "no_totals": "Total Allocated"}[key])
            if key == "no_totals":
                args.pop("Total Reserved")
        self.b.events.append({"ph": "i", "s": "t", "name": "[memory]", "pid": HOST_PID, "tid": self.tid, "ts": ts, "args": args})

    def alloc(self, ts: float, addr: int, nbytes: int, **drop: bool) -> None:
        self.sizes[addr] = nbytes
        self.event(ts, addr, nbytes, **drop)

    def free(self, ts: float, addr: int, nbytes: int | None = None, **drop: bool) -> None:
        self.event(ts, addr, -(nbytes if nbytes is not None else self.sizes.pop(addr)), **drop)


def _training(tmp_path: Path, steps: int = 5, leak: int = 4 * MIB, temp: int = 32 * MIB, **drop: bool) -> Report:
    """Each step: `aten::ones` keeps a `leak` block for good, `aten::mul` makes a `temp` temporary freed
    in `aten::sum`; before the steps a block allocated before the capture is freed (an orphan free)."""
    b = TraceBuilder().gpu()
    mem = Allocator(b)
    mem.allocated = 10 * MIB  # allocated before the capture
    mem.free(50.0, addr=999, nbytes=MIB, **drop)  # a block allocated before the capture
    for i in range(steps):
        t0 = 100.0 + i * STEP_US
        b.step(i + 5, t0, STEP_US - 10)
        b.op("aten::mul", t0 + 100, 100)
        b.op("aten::empty", t0 + 110, 10)
        mem.alloc(t0 + 115, addr=5000, nbytes=temp, **drop)
        b.op("aten::ones", t0 + 300, 50)
        mem.alloc(t0 + 310, addr=1000 + i, nbytes=leak, **drop)
        b.op("aten::sum", t0 + 500, 100)
        mem.free(t0 + 550, addr=5000, **drop)
    path = b.write(tmp_path / "trace.json")
    return torchscope.analyze(path, jobs=1, use_cache=False)


def test_blocks_pair_with_their_frees_and_the_peak_is_attributed(tmp_path: Path) -> None:
    report = _training(tmp_path)
    memory = report.memory
    assert memory.has_addresses and memory.unpaired_frees == 1 and memory.unpaired_allocations == 5
    peak = memory.peaks["cuda:0"]
    # The peak: in the last step, while the temporary and all five leaked blocks are alive.
    assert peak.allocated_bytes == 9 * MIB + 5 * 4 * MIB + 32 * MIB
    assert peak.step == 9 and peak.operator == "aten::ones"
    assert peak.alive_by_operator == {"aten::mul": 32 * MIB, "aten::ones": 20 * MIB}
    assert peak.unattributed_bytes == 9 * MIB  # the blocks allocated before the capture
    assert peak.reserved_bytes == 2 * peak.allocated_bytes + 64 * MIB


def test_churn_and_growth_per_step(tmp_path: Path) -> None:
    report = _training(tmp_path)
    rows = [r for r in report.memory.per_step if r.device == "cuda:0"]
    assert [r.temporary_bytes for r in rows] == [32 * MIB] * 5
    assert [r.alloc_count for r in rows] == [2] * 5 and [r.free_count for r in rows] == [1] * 5
    assert [r.allocated_at_end_bytes - r.allocated_at_start_bytes for r in rows] == [4 * MIB] * 5
    fit = report.memory.growth["cuda:0"]
    assert fit.bytes_per_step == 4 * MIB and fit.low_bytes_per_step == 4 * MIB and fit.r2 == 1.0 and fit.boundaries == 6
    figures = report.measurements.memory
    assert figures.churn_bytes_per_step == {"cuda:0": 32 * MIB}
    assert figures.growth_bytes_per_step == {"cuda:0": 4 * MIB}
    assert [f.id for f in report.findings if f.category == "memory"] == ["memory.leak", "memory.churn"]


def test_old_traces_without_addr_or_totals(tmp_path: Path) -> None:
    """PyTorch <= 1.9: sizes only. The allocated total is their running sum; nothing can be paired, so
    the peak is unattributed and no churn figure is claimed, while growth still shows."""
    report = _training(tmp_path, no_addr=True, no_totals=True)
    memory = report.memory
    assert not memory.has_addresses and memory.peaks["cuda:0"].alive_by_operator == {}
    # Running sum from the capture's start, shifted so it never goes below zero (the orphan free).
    assert memory.peak_allocated_bytes["cuda:0"] == 5 * 4 * MIB + 32 * MIB
    assert memory.peaks["cuda:0"].unattributed_bytes == memory.peak_allocated_bytes["cuda:0"]
    assert "cuda:0" not in memory.peak_reserved_bytes
    assert report.measurements.memory.churn_bytes_per_step == {}
    assert report.measurements.memory.growth_bytes_per_step == {"cuda:0": 4 * MIB}


def test_thread_written_as_text_on_ops_and_as_number_on_memory_events(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.step(3, 0.0, 100.0)
    b.events.append({"ph": "X", "cat": "Operator", "name": "aten::empty", "pid": HOST_PID, "tid": str(HOST_TID), "ts": 10.0, "dur": 5.0, "args": {}})
    Allocator(b, device_type=0, device_id=-1).alloc(12.0, addr=7, nbytes=4096)
    report = torchscope.analyze(b.write(tmp_path / "t.json"), jobs=1, use_cache=False)
    assert report.memory.peaks["cpu"].operator == "aten::empty"


def test_allocator_calls_after_the_first_step_cost_time(tmp_path: Path) -> None:
    b = TraceBuilder().gpu()
    for i in range(4):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.runtime("cudaMalloc", t0 + 10, 100.0)
        b.runtime("cudaFree", t0 + 200, 50.0)
    report = torchscope.analyze(b.write(tmp_path / "t.json"), jobs=1, use_cache=False)
    figures = report.measurements.memory
    assert figures.allocator_calls_per_step == 2.0 and figures.allocator_us_per_step == 150.0
    frag = next(f for f in report.findings if f.id == "memory.fragmentation")
    assert frag.time_share == 0.15 and frag.severity == "warning"


def test_cache_given_back_every_step_is_named(tmp_path: Path) -> None:
    """torch.cuda.empty_cache() each step: a cudaFree under no operator (it is not one), then the next step's
    operator takes the memory again with cudaMalloc. A free inside an operator (an out-of-memory retry) is not it."""

    def trace(release_inside_op: bool) -> Report:
        b = TraceBuilder().gpu()
        for i in range(4):
            t0 = i * STEP_US
            b.step(i + 5, t0, STEP_US)
            b.op("aten::empty", t0 + 5, 120.0)
            b.runtime("cudaMalloc", t0 + 10, 100.0)
            if release_inside_op:
                b.op("aten::empty", t0 + 195, 60.0)
            b.runtime("cudaFree", t0 + 200, 50.0)
        return torchscope.analyze(b.write(tmp_path / f"t{release_inside_op}.json"), jobs=1, use_cache=False)

    report = trace(release_inside_op=False)
    assert report.measurements.memory.cache_releases_per_step == 1.0
    frag = next(f for f in report.findings if f.id == "memory.fragmentation")
    assert frag.title.startswith("torch.cuda.empty_cache() gives the cache back every step: 1.0 cudaFree per step")
    assert [fix.target for fix in frag.fixes] == ["torch.cuda.empty_cache"] and frag.time_share == 0.15
    assert "PYTORCH_CUDA_ALLOC_CONF" not in frag.recommendation
    report = trace(release_inside_op=True)
    assert report.measurements.memory.cache_releases_per_step == 0.0
    frag = next(f for f in report.findings if f.id == "memory.fragmentation")
    assert [fix.target for fix in frag.fixes] == ["PYTORCH_CUDA_ALLOC_CONF"] and "empty_cache" not in frag.recommendation


def test_pairing_reuses_addresses_in_time_order() -> None:
    # addr 1: alloc, free, alloc again (never freed); addr 2: free only (orphan).
    nbytes = np.array([10, 5, -10, 20, -7])
    addr = np.array([1, 3, 1, 1, 2])
    memory = DeviceMemory(np.arange(5), np.arange(5.0), nbytes, np.cumsum(nbytes), None, addr)
    blocks = pair_blocks(memory)
    assert blocks.alloc.tolist() == [0, 1, 3] and blocks.free.tolist() == [2, -1, -1] and blocks.orphan_frees == 1
    assert blocks.alive_at(2).tolist() == [False, True, False]


def test_growth_slope_ignores_one_odd_step() -> None:
    """Theil-Sen: an optimizer creating its state in the first step does not read as a leak."""
    at_start = np.array([0, 100, 100, 100, 100, 100], dtype=float) * MIB
    traffic = StepTraffic(at_start, np.r_[at_start[1:], 100 * MIB], *([np.zeros(6)] * 6), np.zeros(0), np.zeros(0))
    fit = growth(traffic)
    assert fit.bytes_per_step == 0.0 and fit.low_bytes_per_step == 0.0


def test_two_ranks_merge_as_declared(tmp_path: Path) -> None:
    """Peaks: the largest over ranks, with its rank; step rows: every rank's; growth: the span with the
    most steps; the rules' figures: the step-weighted mean."""
    for rank, (steps, leak) in enumerate([(3, 2 * MIB), (5, 4 * MIB)]):
        b = TraceBuilder().gpu().rank(rank, 2)
        mem = Allocator(b)
        for i in range(steps):
            t0 = 100.0 + i * STEP_US
            b.step(i + 5, t0, STEP_US - 10)
            b.op("aten::ones", t0 + 300, 50)
            mem.alloc(t0 + 310, addr=1000 + i, nbytes=leak)
        b.write(tmp_path / "run" / f"rank{rank}.pt.trace.json")
    report = torchscope.analyze(tmp_path / "run", jobs=1, use_cache=False)
    memory = report.memory
    assert memory.peaks["cuda:0"].rank == 1 and memory.peak_allocated_bytes["cuda:0"] == 5 * 4 * MIB
    assert sorted((r.rank, r.step) for r in memory.per_step) == [(0, 5), (0, 6), (0, 7), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9)]
    assert memory.growth["cuda:0"].bytes_per_step == 4 * MIB and memory.growth["cuda:0"].boundaries == 6
    assert report.measurements.memory.growth_bytes_per_step["cuda:0"] == (3 * 2 * MIB + 5 * 4 * MIB) / 8


def test_memory_columns_read_as_indexing_them(tmp_path: Path) -> None:
    """`memory_events` reads a column every `[memory]` event carries without expanding it, and one only
    some carry (a block without `Addr`) as indexing it does; either way in time order."""
    b = TraceBuilder()
    b.step(3, 0.0, 100.0)
    mem = Allocator(b)
    mem.alloc(30.0, addr=1, nbytes=MIB)
    mem.alloc(20.0, addr=2, nbytes=2 * MIB, no_addr=True)  # written out of time order, without an address
    mem.free(40.0, addr=1)
    events = load_trace_file(b.write(tmp_path / "t.json"), False, 1, None).events
    memory = memory_events(events)
    assert events.ts_us[memory.rows].tolist() == [20.0, 30.0, 40.0]
    for column, read in (("mem_bytes", memory.nbytes), ("addr", memory.addr), ("total_allocated", memory.total_allocated),
                         ("total_reserved", memory.total_reserved), ("device_type", memory.device_type), ("device_id", memory.device_id)):  # fmt: skip
        expected = np.asarray(getattr(events, column)[memory.rows])
        assert read.dtype == expected.dtype and read.tolist() == expected.tolist(), column
    assert memory.addr.tolist() == [-1, 1, 1] and memory.nbytes.tolist() == [2 * MIB, MIB, -MIB]


def _caching_allocator(tmp_path: Path, events: int) -> tuple[Report, list[tuple[float, int, int, int]]]:
    """A caching allocator's totals: reserved grows in 20 MiB segments and is kept when blocks are freed
    (so it is no function of allocated); a CPU device writes its own `[memory]` events with reserved 0.
    Returns the report and the events written: (ts, device type, allocated, reserved)."""
    b = TraceBuilder().gpu()
    for i in range(3):
        b.step(i, 100.0 + i * STEP_US, STEP_US - 10)
    written: list[tuple[float, int, int, int]] = []
    allocated, reserved = 0, 0
    for n in range(events):
        ts = 150.0 + n * (3 * STEP_US - 100) / events
        delta = (n % 7 + 1) * 3 * MIB if n % 3 != 2 else -allocated // 2  # grow, grow, give half back
        allocated += delta
        reserved = max(reserved, -(-allocated // (20 * MIB)) * 20 * MIB)
        b.memory(ts, allocated=allocated, reserved=reserved, delta=delta)
        written.append((ts, 1, allocated, reserved))
        if n % 10 == 0:
            b.memory(ts + 1, allocated=(n // 10 + 1) * 1024, reserved=0, device_type=0, device_id=-1, delta=1024)
            written.append((ts + 1, 0, (n // 10 + 1) * 1024, 0))
    report = torchscope.analyze(b.write(tmp_path / "trace.json"), jobs=1, use_cache=False)
    return report, written


def test_allocated_and_reserved_over_time_come_from_the_events_totals(tmp_path: Path) -> None:
    """Both series per device, read from each event's `Total Allocated` and `Total Reserved` (times from
    the first step's start), reserved staying up while allocated falls, as the caching allocator keeps
    freed segments (a CPU's zero `Total Reserved` draws no reserved series)."""
    report, written = _caching_allocator(tmp_path, events=60)
    memory = report.memory
    origin = 100.0
    gpu = [(ts - origin, a, r) for ts, kind, a, r in written if kind == 1]
    assert memory.timeline["cuda:0"] == [[t, float(a)] for t, a, _ in gpu]
    assert memory.reserved_timeline["cuda:0"] == [[t, float(r)] for t, _, r in gpu]
    assert memory.reserved_timeline["cuda:0"] != memory.timeline["cuda:0"]
    assert any(r_after == r_before and a_after < a_before  # freed blocks leave reserved where it was
               for (_, a_before, r_before), (_, a_after, r_after) in zip(gpu, gpu[1:]))
    assert memory.peak_reserved_bytes["cuda:0"] == max(r for _, _, r in gpu)
    assert memory.peak_allocated_bytes["cuda:0"] == max(a for _, a, _ in gpu)
    # The CPU allocator reserves nothing ahead (its `Total Reserved` stays 0): an allocated series only.
    assert "cpu" not in memory.reserved_timeline and "cpu" not in memory.peak_reserved_bytes
    assert [value for _, value in memory.timeline["cpu"]] == [float(a) for _, kind, a, _ in written if kind == 0]


def test_a_long_reserved_series_is_thinned_without_losing_its_peak(tmp_path: Path) -> None:
    from torchscope.analysis.memory import MAX_POINTS

    report, written = _caching_allocator(tmp_path, events=3 * MAX_POINTS + 7)
    series = report.memory.reserved_timeline["cuda:0"]
    gpu = {ts - 100.0: r for ts, kind, _, r in written if kind == 1}
    assert len(series) == MAX_POINTS
    assert all(gpu[t] == value for t, value in series)  # thinned to events, not interpolated
    assert max(value for _, value in series) == max(gpu.values()) == report.memory.peak_reserved_bytes["cuda:0"]
    assert [t for t, _ in series] == sorted(t for t, _ in series)


def _cpu_training(tmp_path: Path, device_type: int, device_id: int) -> Report:
    """Three steps, each making 32 MiB of gradients (freed in the next step) and keeping a 4 MiB block, as
    c10's CPU allocator reports them: its total starts at 0 when recording starts, and the free of the
    gradients made before recording is not reported."""
    b = TraceBuilder()
    mem = Allocator(b, device_type=device_type, device_id=device_id)
    for i in range(3):
        t0 = 100.0 + i * STEP_US
        b.step(i + 2, t0, STEP_US - 10)
        if i > 0:
            mem.free(t0 + 150, addr=2000 + i - 1)
        mem.alloc(t0 + 200, addr=2000 + i, nbytes=32 * MIB)
        mem.alloc(t0 + 310, addr=1000 + i, nbytes=4 * MIB)
    return torchscope.analyze(b.write(tmp_path / "trace.json"), jobs=1, use_cache=False)


def test_cpu_growth_starts_at_the_second_step(tmp_path: Path) -> None:
    # With the first step in, the gradients whose free went unreported read as growth: 36 MiB, then 4, 4.
    report = _cpu_training(tmp_path, device_type=0, device_id=-1)
    fit = report.memory.growth["cpu"]
    assert fit.bytes_per_step == 4 * MIB and fit.r2 == 1.0 and fit.boundaries == 3
    assert report.measurements.memory.growth_steps == {"cpu": 2.0}
    leak = next(f for f in report.findings if f.id == "memory.leak")
    assert leak.evidence["growth_bytes_per_step"] == 4 * MIB
    # A device whose allocator reports device-wide totals keeps its first step.
    (tmp_path / "gpu").mkdir()
    assert _cpu_training(tmp_path / "gpu", device_type=1, device_id=0).memory.growth["cuda:0"].boundaries == 4
