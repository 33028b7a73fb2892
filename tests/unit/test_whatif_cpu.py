"""The what-if model's CPU mechanisms on synthetic traces with hand-computed answers: foreach keeps the
per-tensor operators of the optimizer step, vectorising keeps the leaf operators' arithmetic, a
checkpoint moved to every N steps keeps 1/N, and DataLoader workers save what the cores they get allow."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.analysis import whatif
from torchscope.diagnose.rules_input import RECEIVE_KEPT, Machine, _advised_saving, advise
from torchscope.report.model import Report
from torchscope.rundir.labels import PHASE_LABELS

STEP_US = 10_000.0
STEPS = 4


def _report(builder: TraceBuilder, tmp_path: Path) -> Report:
    return torchscope.analyze(builder.write(tmp_path / "trace.pt.trace.json"), jobs=1, use_cache=False)


def _finding(report: Report, finding_id: str):  # type: ignore[no-untyped-def]
    return next(f for f in report.findings if f.id == finding_id)


def _optimizer_steps(ops: list[tuple[str, float, float]]) -> TraceBuilder:
    """STEPS steps, each with a 4 ms Optimizer.step#Adam.step from 5 ms in, holding `ops` (name, start
    from the step's start, duration in us)."""
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.annotation("Optimizer.step#Adam.step", t0 + 5000, 4000)
        for name, start, dur in ops:
            b.op(name, t0 + start, dur)
    return b


def test_foreach_on_a_cpu_saves_the_python_between_the_optimizer_ops_not_the_ops(tmp_path: Path) -> None:
    # Optimizer.step: 4 ms, of which 40 per-parameter ops of 50 us cover 2 ms; the other 2 ms is Python.
    report = _report(_optimizer_steps([("aten::add_", 5000 + k * 100, 50) for k in range(40)]), tmp_path)
    savings = report.measurements.savings
    assert savings.model == "host_critical_path"
    python_us = ops_us = 2000.0
    (python_low, python_high), (ops_low, ops_high) = whatif.KEPT_CPU_OPTIMIZER_PYTHON, whatif.KEPT_CPU_OPTIMIZER_OPS
    assert savings.saved_us_per_step_low["optimizer_step"] == pytest.approx((1 - python_low) * python_us + (1 - ops_low) * ops_us, rel=1e-3)
    assert savings.saved_us_per_step_high["optimizer_step"] == pytest.approx((1 - python_high) * python_us + (1 - ops_high) * ops_us, rel=1e-3)
    optimizer = _finding(report, "optimizer.step")
    assert optimizer.time_share_low == pytest.approx(0.10, abs=1e-3)  # half the Python, every op kept: 1 of 10 ms
    assert optimizer.time_share_high == pytest.approx(0.30, abs=1e-3)  # all the Python, half the ops; not 40 %


def _tiny_op_forward(b: TraceBuilder, t0: float, per_sample: bool) -> None:
    """A 6 ms forward: 250 iterations of 20 us, then one 1 ms `aten::mm` leaf (real arithmetic). Each
    iteration: (per sample: a 2 us `aten::select` of the next row, then) a 14 us `aten::linear` around a
    10 us `aten::addmm` leaf, and Python for the rest of the 20 us."""
    b.annotation(PHASE_LABELS["forward"], t0, 6000)
    for k in range(250):
        at = t0 + k * 20
        if per_sample:
            b.op("aten::select", at, 2)
        b.op("aten::linear", at + 4, 14)
        b.op("aten::addmm", at + 6, 10)
    b.op("aten::mm", t0 + 5000, 1000)


def _tiny_op_steps(tmp_path: Path, per_sample: bool) -> Report:
    b = TraceBuilder()
    for i in range(STEPS):
        b.step(i, i * STEP_US, STEP_US)
        _tiny_op_forward(b, i * STEP_US, per_sample)
    return _report(b, tmp_path)


def test_vectorising_a_per_sample_loop_saves_all_but_the_leaf_operators_arithmetic(tmp_path: Path) -> None:
    report = _tiny_op_steps(tmp_path, per_sample=True)
    assert report.measurements.patterns.indexing_loop_iterations_per_step == 250
    savings = report.measurements.savings
    # Low: every leaf kept (250 x (2 + 10) us + 1 ms): 6 - 4 ms; high: only the 1 ms leaf: 6 - 1 ms.
    assert savings.saved_us_per_step_low["dispatch"] == pytest.approx(2000.0, rel=1e-3)
    assert savings.saved_us_per_step_high["dispatch"] == pytest.approx(5000.0, rel=1e-3)
    dispatch = _finding(report, "host_overhead.dispatch")
    assert (dispatch.time_share_low, dispatch.time_share_high) == pytest.approx((0.20, 0.50), abs=1e-3)
    assert dispatch.time_share == pytest.approx(0.35, abs=1e-3)


def test_without_a_loop_to_batch_compile_saves_the_python_and_at_most_the_tiny_ops(tmp_path: Path) -> None:
    report = _tiny_op_steps(tmp_path, per_sample=False)
    assert report.measurements.patterns.indexing_loop_iterations_per_step == 0
    # Python between ops: 6 ms - 250 x 14 us - 1 ms = 1.5 ms; tiny ops: 250 x 14 us = 3.5 ms.
    dispatch = _finding(report, "host_overhead.dispatch")
    assert (dispatch.time_share_low, dispatch.time_share_high) == pytest.approx((0.15, 0.50), abs=1e-3)
    assert dispatch.time_share == pytest.approx(0.325, abs=1e-3)


def test_a_checkpoint_every_n_steps_keeps_at_most_a_tenth_of_it(tmp_path: Path) -> None:
    # 9 ms of a checkpoint's copy after a 1 ms forward, outside every phase.
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.annotation(PHASE_LABELS["forward"], t0, 1000)
        b.op("aten::mm", t0 + 10, 980)
        b.op("aten::copy_", t0 + 1000, 9000)
    report = _report(b, tmp_path)
    savings = report.measurements.savings
    assert whatif.KEPT["outside_steps"] == (0.1, 0.0)  # every 10 steps .. asynchronous
    assert savings.saved_us_per_step_low["outside_steps"] == pytest.approx(0.9 * 9000.0, rel=1e-3)
    assert savings.saved_us_per_step_high["outside_steps"] == pytest.approx(9000.0, rel=1e-3)
    outside = _finding(report, "outside_steps.work")
    assert (outside.time_share_low, outside.time_share_high) == pytest.approx((0.81, 0.90), abs=1e-3)


def test_workers_with_spare_cores_save_the_loading_they_take_off_the_main_process() -> None:
    # 4 cores, compute on 2 threads: 2 spare cores. Loading 30 ms of a 40 ms step: 2 workers (3 would keep
    # up, 6 with the margin, 2 fit); each batch takes a worker 30 ms, so the step is max(10, 30 / 2) = 15 ms.
    machine = Machine(cores_per_rank=4, threads=2, workers=0, device=False, waiting=False)
    advice = advise(machine, 30_000.0, 40_000.0)
    assert (advice.workers, advice.predicted_step_us) == (2, pytest.approx(15_000.0))
    share, (low, high) = _advised_saving(advice, 30_000.0, 40_000.0)
    assert high == pytest.approx(25 / 40)
    # Low: the main process also keeps RECEIVE_KEPT of the loading: max(15, 10 + 7.5) = 17.5 ms.
    assert low == pytest.approx((40 - (10 + RECEIVE_KEPT * 30)) / 40)
    assert share == pytest.approx((low + high) / 2)


def test_a_worker_that_takes_compute_s_core_saves_only_what_compute_can_give_up() -> None:
    # 2 cores, both running intra-op threads: one worker with one thread fewer. Compute 10 ms -> 20 ms on
    # one thread, loading 30 ms in the worker: the step is max(30, 20) = 30 ms, a 10 ms saving, not 30.
    machine = Machine(cores_per_rank=2, threads=2, workers=0, device=False, waiting=False)
    advice = advise(machine, 30_000.0, 40_000.0)
    assert (advice.workers, advice.threads, advice.predicted_step_us) == (1, 1, pytest.approx(30_000.0))
    share, (low, high) = _advised_saving(advice, 30_000.0, 40_000.0)
    assert (share, low, high) == pytest.approx((0.25, 0.25, 0.25))


def test_loading_that_waits_overlaps_in_workers_without_cores() -> None:
    # time.sleep-like loading, 48 ms of a 60 ms step on 2 busy cores: 8 workers (the cap); the step is
    # max(12, 48 / 8) = 12 ms.
    machine = Machine(cores_per_rank=2, threads=2, workers=0, device=False, waiting=True)
    advice = advise(machine, 48_000.0, 60_000.0)
    assert (advice.workers, advice.predicted_step_us) == (8, pytest.approx(12_000.0))
    _, (low, high) = _advised_saving(advice, 48_000.0, 60_000.0)
    assert high == pytest.approx(48 / 60)
    assert low == pytest.approx((60 - (12 + RECEIVE_KEPT * 48)) / 60)


def test_a_fused_optimizer_on_a_cpu_keeps_the_gathering_python_the_step_counters_and_some_arithmetic(tmp_path: Path) -> None:
    # Optimizer.step: 4 ms; 40 per-parameter ops of 20 us (dispatch, 0.8 ms) and 2 of 600 us (at least
    # TINY_OP_US: arithmetic, 1.2 ms); the other 2 ms is Python.
    ops = [("aten::add_", 5000 + k * 50, 20) for k in range(40)] + [("aten::addcdiv_", 7000 + k * 1000, 600) for k in range(2)]
    savings = _report(_optimizer_steps(ops), tmp_path).measurements.savings
    # Kept, pessimistic .. optimistic: Python 35 .. 15 %, dispatch 30 .. 10 %, arithmetic 100 .. 20 %.
    assert (whatif.KEPT_CPU_FUSED_PYTHON, whatif.KEPT_CPU_FUSED_DISPATCH, whatif.KEPT_CPU_FUSED_ARITHMETIC) == ((0.35, 0.15), (0.3, 0.1), (1.0, 0.2))
    assert savings.saved_us_per_step_low["optimizer_step_fused"] == pytest.approx(0.65 * 2000 + 0.7 * 800 + 0.0 * 1200, rel=1e-3)  # 1860
    assert savings.saved_us_per_step_high["optimizer_step_fused"] == pytest.approx(0.85 * 2000 + 0.9 * 800 + 0.8 * 1200, rel=1e-3)  # 3380
    # foreach, for comparison: every op .. half kept, arithmetic or not.
    assert savings.saved_us_per_step_high["optimizer_step"] == pytest.approx(2000 + 0.5 * 2000, rel=1e-3)


def _chunk_loop_steps(tmp_path: Path) -> Report:
    """An 8 ms forward per 10 ms step: 10 iterations of 700 us, each a 2 us `aten::select` and a 600 us
    `aten::linear` of [128, 512] x [1024, 512] (134 MFLOP) around its `aten::t` and `aten::addmm`, which
    calls `aten::resolve_conj` as on a CPU; then a 400 us matrix-vector `aten::mm` of [1, 512] x [512, 512]
    (0.5 MFLOP), a leaf."""
    dims = [[128, 512], [1024, 512], [1024]]

    def iteration(b: TraceBuilder, at: float) -> None:
        b.op("aten::linear", at + 10, 600, **{"Input Dims": dims})
        b.op("aten::t", at + 12, 4)
        b.op("aten::addmm", at + 20, 585)
        b.op("aten::resolve_conj", at + 22, 2)

    def after(b: TraceBuilder, t0: float) -> None:
        b.op("aten::mm", t0 + 7100, 400, **{"Input Dims": [[1, 512], [512, 512]]})

    return _report(_indexing_loop_steps(iteration, after), tmp_path)


def _indexing_loop_steps(iteration: Callable[[TraceBuilder, float], None], after: Callable[[TraceBuilder, float], None] | None = None) -> TraceBuilder:
    """STEPS steps, each an 8 ms forward (torchscope's label) from the step's start holding a loop of 10
    iterations 700 us apart, each a 2 us `aten::select` and then `iteration(b, its start)`; `after(b, step
    start)` adds the step's other ops."""
    b = TraceBuilder()
    for i in range(STEPS):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.annotation(PHASE_LABELS["forward"], t0, 8000)
        for k in range(10):
            b.op("aten::select", t0 + k * 700, 2)
            iteration(b, t0 + k * 700)
        if after is not None:
            after(b, t0)
    return b


def test_batching_keeps_the_matmuls_flops_at_the_rate_of_the_traces_large_matmuls(tmp_path: Path) -> None:
    report = _chunk_loop_steps(tmp_path)
    dispatch = report.measurements.dispatch
    flops = 10 * 2 * 128 * 512 * 1024 + 2 * 512 * 512
    assert dispatch.matmul_us_per_step == pytest.approx(10 * 600 + 400)
    assert dispatch.matmul_gflop_per_step == pytest.approx(flops / 1e9)
    rate = 2 * 128 * 512 * 1024 / 600e-6 / 1e9  # the large linears' own rate: 224 GFLOP/s
    assert dispatch.matmul_large_gflops == pytest.approx(rate)
    assert dispatch.matmul_unrated_us_per_step == 0.0  # a rate from the trace: the capture's is not needed
    patterns = report.measurements.patterns
    assert patterns.indexing_loop_iterations_per_step == 10
    assert patterns.indexing_loop_compute_us_per_step == pytest.approx(patterns.indexing_loop_us_per_step)  # all in forward
    # Kept: the linears' 6 ms and the matrix-vector product's FLOPs at that rate (2.3 us, not its 400 us);
    # low also keeps the selects (20 us), the only leaves outside a matmul; resolve_conj is no arithmetic.
    kept = flops / 1e9 / rate * 1e6
    savings = report.measurements.savings
    assert savings.saved_us_per_step_low["dispatch"] == pytest.approx(8000 - 20 - kept, rel=1e-4)
    assert savings.saved_us_per_step_high["dispatch"] == pytest.approx(8000 - kept, rel=1e-4)


def test_without_a_large_unit_only_matrix_multiplies_take_the_captures_matmul_rate(tmp_path: Path) -> None:
    """A per-sample loop of a 16-channel convolution (4.7 MFLOP, under the large-unit size) and a
    matrix-vector product: both are units, but only the product may be kept at the matmul rate measured
    at capture end (a small convolution runs far below it); the convolution stays all .. none."""

    def iteration(b: TraceBuilder, at: float) -> None:
        b.op("aten::conv2d", at + 10, 185, **{"Input Dims": [[1, 16, 32, 32], [16, 16, 3, 3], [16], [], [], [], []],
                                               "Concrete Inputs": ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]})
        b.op("aten::mm", at + 300, 200, **{"Input Dims": [[1, 512], [512, 512]]})

    report = _report(_indexing_loop_steps(iteration), tmp_path)
    dispatch = report.measurements.dispatch
    conv, gemv = 2 * 16 * 16 * 3 * 3 * 32 * 32, 2 * 512 * 512
    assert dispatch.matmul_gflop_per_step == pytest.approx(10 * (conv + gemv) / 1e9)
    assert (dispatch.matmul_large_us_per_step, dispatch.matmul_large_gflops) == (0.0, 0.0)
    assert dispatch.matmul_unrated_us_per_step == pytest.approx(10 * 200)
    assert dispatch.matmul_unrated_gflop_per_step == pytest.approx(10 * gemv / 1e9)
