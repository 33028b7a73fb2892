"""Gradient accumulation under data parallelism (analysis/grad_sync.py, communication.accumulation_sync):
micro-steps and the backward passes that synchronise gradients, on synthetic GPU traces built the way DDP
and FSDP record them, and the rule on hand-built Reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_rules_support import finding, findings, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.report.distributed import Distributed
from torchscope.report.measurements import GradientSync, Measurements
from torchscope.report.model import Report

STEP_US = 40_000.0
MICRO = 4
MICRO_US = STEP_US / MICRO
SYNC_US = 2_000.0  # one micro-step's gradient all-reduce on the device
EXPOSED_US = 1_000.0  # of it, after the backward's compute


def _accumulation_trace(syncing: set[int], wrapper: str = "DistributedDataParallel.forward", nested: bool = False,
                        collective: str = "allreduce", sync_bn: bool = False, optimizer_after: set[int] = frozenset(),
                        recompute: bool = False) -> TraceBuilder:
    """3 steps of 4 micro-steps. Each: the wrapper's forward range with a compute kernel, a backward whose
    AccumulateGrad node launches the gradient collective in the micro-steps of `syncing` (its NCCL kernel
    overlaps the backward's kernel by half), and, in every micro-step, a decoy: the loss all-reduced for
    logging, outside the backward."""
    b = TraceBuilder().gpu().rank(0, 2)
    kernel = {"allreduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              "reduce_scatter_tensor": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"}[collective]
    for step in range(3):
        t0 = step * STEP_US
        b.step(step, t0, STEP_US)
        for i in range(MICRO):
            m = t0 + i * MICRO_US
            b.annotation(wrapper, m + 10, 2_000)
            if nested:  # FSDP: every wrapped submodule records the same range inside its parent's
                b.annotation(wrapper, m + 100, 1_500)
            b.launch(m + 200, 10, m + 300, 1_500)
            b.op("autograd::engine::evaluate_function: AddmmBackward0", m + 3_000, 1_000)
            b.launch(m + 3_100, 10, m + 3_200, 2_000)  # backward compute: device 3,200-5,200
            if recompute:  # a checkpointed FSDP unit's forward run again inside the backward
                b.annotation(wrapper, m + 3_400, 300)
            if sync_bn:  # SyncBatchNorm's backward all-reduces its statistics in every micro-step
                b.op("autograd::engine::evaluate_function: SyncBatchNormBackward", m + 2_500, 400)
                b.op("c10d::allreduce_", m + 2_600, 50)
                b.launch(m + 2_610, 10, m + 2_700, 300, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(y)", stream=20)
            b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", m + 4_000, 500)
            if i in syncing:
                b.op(f"c10d::{collective}_", m + 4_100, 100)
                b.launch(m + 4_150, 10, m + 4_200, SYNC_US, name=kernel, stream=20)  # device 4,200-6,200
            b.op("c10d::allreduce_", m + 8_000, 50)  # the loss, for logging
            if i in optimizer_after:
                b.annotation("Optimizer.step#Adam.step", m + 9_000, 500)
            b.launch(m + 8_010, 10, m + 8_100, 5, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", stream=20)
    return b


def _sync(tmp_path: Path, builder: TraceBuilder) -> GradientSync:
    rep = torchscope.analyze(builder.write(tmp_path / "rank0.pt.trace.json"), jobs=1, use_cache=False)
    return rep.measurements.grad_sync


def test_every_micro_step_synchronising_is_counted_and_timed(tmp_path: Path) -> None:
    sync = _sync(tmp_path, _accumulation_trace(syncing={0, 1, 2, 3}))
    assert sync.wrapper == "DistributedDataParallel"
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step) == (4, 4)
    assert sync.redundant_micro_steps_per_step == 3
    # Per step: four 2 ms gradient all-reduces (each paired with its c10d op; the four 5 us logging ones are
    # not gradient syncs), half of each overlapping the backward kernel; the first three are redundant.
    assert sync.sync_us_per_step == pytest.approx(MICRO * SYNC_US)
    assert sync.sync_exposed_us_per_step == pytest.approx(MICRO * EXPOSED_US)
    assert sync.redundant_sync_us_per_step == pytest.approx(3 * SYNC_US)
    assert sync.redundant_exposed_us_per_step == pytest.approx(3 * EXPOSED_US)
    assert sync.collective_exposed_us_per_step == pytest.approx(MICRO * (EXPOSED_US + 5))


@pytest.mark.parametrize(
    ("range_name", "wrapper"),
    [("DistributedDataParallel.forward", "DistributedDataParallel"), ("FullyShardedDataParallel.forward", "FullyShardedDataParallel"),
     ("FSDP::root_pre_forward", "fully_shard"), ("forward_pass", "")],
)
def test_the_wrapper_is_read_without_accumulation_too(tmp_path: Path, range_name: str, wrapper: str) -> None:
    """`measurements.data_parallel`: one forward per step still names the wrapper (the communication rule's
    fixes depend on it); a trace without one leaves the section out."""
    b = TraceBuilder().gpu().rank(0, 2)
    for step in range(3):
        b.step(step, step * STEP_US, STEP_US)
        b.annotation(range_name, step * STEP_US + 10, 2_000)
    rep = torchscope.analyze(b.write(tmp_path / "rank0.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.data_parallel.wrapper == wrapper
    assert rep.measurements.grad_sync.micro_steps_per_step == 0  # no accumulation: that section stays out


def test_fsdp_units_per_forward_pass(tmp_path: Path) -> None:
    """FSDP1: nested `FullyShardedDataParallel.forward` ranges per pass; FSDP2: `FSDP::pre_forward (fqn)` ranges
    (the root's without one) per `FSDP::root_pre_forward`."""
    b = TraceBuilder().gpu().rank(0, 2)
    for step in range(3):
        t0 = step * STEP_US
        b.step(step, t0, STEP_US)
        b.annotation("FullyShardedDataParallel.forward", t0 + 10, 5_000)
        for unit in range(4):
            b.annotation("FullyShardedDataParallel.forward", t0 + 100 + unit * 1_000, 900)
    rep = torchscope.analyze(b.write(tmp_path / "fsdp1.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.data_parallel.units_per_forward == 5.0
    b = TraceBuilder().gpu().rank(0, 2)
    for step in range(3):
        t0 = step * STEP_US
        b.step(step, t0, STEP_US)
        b.annotation("FSDP::root_pre_forward", t0 + 10, 50)
        b.annotation("FSDP::pre_forward", t0 + 20, 30)
        for unit in range(2):
            b.annotation(f"FSDP::pre_forward ({unit})", t0 + 100 + unit * 1_000, 90)
    rep = torchscope.analyze(b.write(tmp_path / "fsdp2.pt.trace.json"), jobs=1, use_cache=False)
    assert (rep.measurements.data_parallel.wrapper, rep.measurements.data_parallel.units_per_forward) == ("fully_shard", 3.0)
    # Blocks sharded with no fully_shard(model): each block is a root of its own, one unit each: not one unit.
    b = TraceBuilder().gpu().rank(0, 2)
    for step in range(3):
        t0 = step * STEP_US
        b.step(step, t0, STEP_US)
        for unit in range(4):
            b.annotation("FSDP::root_pre_forward", t0 + 100 + unit * 1_000, 50)
            b.annotation("FSDP::pre_forward", t0 + 160 + unit * 1_000, 30)
    rep = torchscope.analyze(b.write(tmp_path / "roots.pt.trace.json"), jobs=1, use_cache=False)
    assert (rep.measurements.data_parallel.wrapper, rep.measurements.data_parallel.units_per_forward) == ("fully_shard", 0.0)


def test_no_sync_on_the_first_micro_steps_leaves_one_sync_and_nothing_redundant(tmp_path: Path) -> None:
    sync = _sync(tmp_path, _accumulation_trace(syncing={3}))
    # The logging all-reduces, outside the backward, are no gradient sync.
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step) == (4, 1)
    assert sync.redundant_sync_us_per_step == 0
    rep = torchscope.analyze(tmp_path / "rank0.pt.trace.json", jobs=1, use_cache=False)
    assert "communication.accumulation_sync" not in {f.id for f in rep.findings}


def test_nested_fsdp_forward_ranges_are_one_micro_step_each(tmp_path: Path) -> None:
    builder = _accumulation_trace({0, 1, 2, 3}, wrapper="FullyShardedDataParallel.forward", nested=True,
                                  collective="reduce_scatter_tensor")
    sync = _sync(tmp_path, builder)
    assert sync.wrapper == "FullyShardedDataParallel"
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step) == (4, 4)
    rep = torchscope.analyze(tmp_path / "rank0.pt.trace.json", jobs=1, use_cache=False)
    f = next(f for f in rep.findings if f.id == "communication.accumulation_sync")
    assert [fix.target for fix in f.fixes] == ["FullyShardedDataParallel.no_sync"]
    assert "reduce-scatters" in f.recommendation and "unsharded gradients" in f.recommendation


def test_one_forward_per_step_is_no_accumulation(tmp_path: Path) -> None:
    b = TraceBuilder().gpu()
    for step in range(3):
        t0 = step * STEP_US
        b.step(step, t0, STEP_US)
        b.annotation("DistributedDataParallel.forward", t0 + 10, 2_000)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 4_000, 500)
        b.op("c10d::allreduce_", t0 + 4_100, 100)
    assert _sync(tmp_path, b) == GradientSync()


def _report(sync: GradientSync, **kwargs: Any) -> Report:
    return report(measurements=Measurements(grad_sync=sync), **kwargs)


SYNCING = GradientSync(
    wrapper="DistributedDataParallel",
    micro_steps_per_step=4,
    syncing_micro_steps_per_step=4,
    redundant_micro_steps_per_step=3,
    sync_us_per_step=4_000,
    sync_exposed_us_per_step=2_000,
    redundant_sync_us_per_step=3_000,
    redundant_exposed_us_per_step=1_500,
    collective_exposed_us_per_step=2_000,
)


def test_rule_states_the_redundant_syncs_and_the_wrappers_fix() -> None:
    rep = _report(SYNCING, breakdown={"communication": 0.2}, phases={"communication": 0.2})
    f = finding(rep, "communication.accumulation_sync")
    step_us = rep.steps[0].duration_us
    # Without an unprofiled clock: the exposed part as recorded, up to all of the collectives' time.
    assert (f.time_share_low, f.time_share_high) == pytest.approx((1_500 / step_us, 3_000 / step_us), abs=1e-4)
    assert f.title.startswith("Gradient accumulation synchronises gradients in 4 of 4 micro-steps")
    assert [fix.target for fix in f.fixes] == ["DistributedDataParallel.no_sync"]
    assert "all-reduces" in f.recommendation and "model.no_sync()" in f.recommendation
    # communication.share keeps the one sync per step that is needed: a quarter of the exposed collectives.
    share = finding(rep, "communication.share")
    assert share.time_share == pytest.approx(0.2 * 0.25, abs=1e-4)
    assert "reported apart" in share.title
    # FSDP: 6 ms of exposed all-gathers stay communication's; only the redundant 1.5 ms of syncs move.
    fsdp = msgspec.structs.replace(SYNCING, collective_exposed_us_per_step=8_000)
    share = finding(_report(fsdp, breakdown={"communication": 0.8}, phases={"communication": 0.8}), "communication.share")
    assert share.time_share == pytest.approx(0.8 * (1 - 1_500 / 8_000), abs=1e-4)


def test_rule_names_fully_shard_and_the_matched_transfer_is_split_too() -> None:
    sync = msgspec.structs.replace(SYNCING, wrapper="fully_shard")
    distributed = Distributed(present=True, matched=8, exposed_transfer_us_per_step=2_000.0, world_size=2)
    rep = msgspec.structs.replace(_report(sync), distributed=distributed)
    f = finding(rep, "communication.accumulation_sync")
    assert [fix.target for fix in f.fixes] == ["FSDPModule.set_requires_gradient_sync"]
    assert "set_requires_gradient_sync(False)" in f.recommendation
    share = finding(rep, "communication.share")
    assert share.evidence["exposed_transfer_us_per_step"] == 2_000.0
    assert share.time_share == pytest.approx(500 / rep.steps[0].duration_us, abs=1e-4)


def test_one_sync_per_step_is_no_finding() -> None:
    one = GradientSync(wrapper="DistributedDataParallel", micro_steps_per_step=4, syncing_micro_steps_per_step=1,
                       sync_us_per_step=1_000, sync_exposed_us_per_step=500)
    rep = _report(one, breakdown={"communication": 0.2}, phases={"communication": 0.2})
    assert "communication.accumulation_sync" not in findings(rep)
    assert finding(rep, "communication.share").time_share == pytest.approx(0.2, abs=1e-4)


def test_other_collectives_in_the_backward_are_no_gradient_sync(tmp_path: Path) -> None:
    # no_sync() used as it should be, and a SyncBatchNorm all-reducing in every micro-step's backward.
    sync = _sync(tmp_path, _accumulation_trace(syncing={3}, sync_bn=True))
    assert (sync.syncing_micro_steps_per_step, sync.redundant_micro_steps_per_step) == (1, 0)
    assert sync.redundant_sync_us_per_step == 0


def test_syncs_each_read_by_an_optimizer_step_are_not_redundant(tmp_path: Path) -> None:
    # A GAN: two DDP models per step, each synced once and stepped by its own optimizer.
    sync = _sync(tmp_path, _accumulation_trace(syncing={0, 1, 2, 3}, optimizer_after={0, 1, 2, 3}))
    assert (sync.syncing_micro_steps_per_step, sync.redundant_micro_steps_per_step) == (4, 0)
    # Stepping after the second and the fourth: only the first and the third were synced again unread.
    sync = _sync(tmp_path, _accumulation_trace(syncing={0, 1, 2, 3}, optimizer_after={1, 3}))
    assert sync.redundant_micro_steps_per_step == 2
    assert sync.redundant_sync_us_per_step == pytest.approx(2 * SYNC_US)


def test_a_forward_run_again_inside_the_backward_is_no_micro_step(tmp_path: Path) -> None:
    builder = _accumulation_trace({0, 1, 2, 3}, wrapper="FullyShardedDataParallel.forward", recompute=True,
                                  collective="reduce_scatter_tensor")
    sync = _sync(tmp_path, builder)
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step) == (4, 4)
