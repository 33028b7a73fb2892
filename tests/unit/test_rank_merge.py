"""Which trace files are one rank (pipeline/rank_merge.py): one process writing files under several worker
names (Lightning's PyTorchProfiler names each after its action) is one rank, not two; the same header rank
is one rank; other processes stay ranks of their own. A rank's spans without backward or optimizer steps
beside training spans are evaluation, left out with a warning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import torchscope
from helpers.trace_builder import HOST_PID, TraceBuilder

STEP_US = 1_000.0
VALIDATION = "[pl][profile][Strategy]SingleDeviceStrategy.validation_step"


def _trace(path: Path, first_step: int, steps: int, t0: float, train: bool = True, pid: int = HOST_PID,
           host: str | None = "node0", rank: int | None = None) -> None:
    """`steps` steps from `t0`: a forward op each, and in training steps a backward op and an optimizer step."""
    b = TraceBuilder()
    if host is not None:
        b.header["host_name"] = host
    if rank is not None:
        b.rank(rank, 2)
    for i in range(steps):
        start = t0 + i * STEP_US
        b.step(first_step + i, start, STEP_US - 10)
        b.op("aten::linear", start + 10, 300)
        if train:
            b.op("autograd::engine::evaluate_function: AddmmBackward0", start + 400, 300)
            b.annotation("Optimizer.step#Adam.step", start + 750, 200)
        else:  # Lightning's validation action: the evidence that a step evaluates
            b.annotation(VALIDATION, start + 5, 400)
    events: list[dict[str, Any]] = b.events
    for event in events:
        if event.get("pid") == HOST_PID:
            event["pid"] = pid
    b.write(path)


def test_one_process_under_two_worker_names_is_one_rank(tmp_path: Path) -> None:
    run = tmp_path / "prof"
    _trace(run / "fit-[Strategy]SingleDeviceStrategy.training_step.1700000000000.pt.trace.json", 5, 4, 0.0)
    _trace(run / "fit-[Strategy]SingleDeviceStrategy.backward.1700000009000.pt.trace.json", 13, 3, 9_000.0)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0] and len(report.ranks) == 1 and len(report.steps) == 7
    assert report.ranks[0].worker == "fit-[Strategy]SingleDeviceStrategy.training_step"
    assert "straggler.rank" not in [f.id for f in report.findings] and not report.distributed.present


def test_other_processes_stay_ranks_of_their_own(tmp_path: Path) -> None:
    run = tmp_path / "prof"
    _trace(run / "a.1700000000000.pt.trace.json", 5, 3, 0.0, pid=101)
    _trace(run / "b.1700000000000.pt.trace.json", 5, 3, 0.0, pid=102)
    _trace(run / "c.1700000000000.pt.trace.json", 5, 3, 0.0, pid=101, host="node1")  # same pid, other host
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0, 1, 2] and [r.worker for r in report.ranks] == ["a", "b", "c"]


def test_the_same_header_rank_under_two_names_is_one_rank(tmp_path: Path) -> None:
    run = tmp_path / "prof"
    _trace(run / "train.1700000000000.pt.trace.json", 5, 3, 0.0, pid=101, rank=1)
    _trace(run / "later.1700000009000.pt.trace.json", 8, 3, 9_000.0, pid=101, rank=1)
    _trace(run / "other.1700000000000.pt.trace.json", 5, 3, 0.0, pid=202, rank=0)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0, 1] and [(r.rank, r.worker) for r in report.ranks] == [(0, "other"), (1, "train")]


def test_evaluation_spans_beside_training_are_left_out_with_a_warning(tmp_path: Path) -> None:
    run = tmp_path / "prof"
    _trace(run / "fit-training_step.1700000000000.pt.trace.json", 5, 4, 0.0)
    _trace(run / "fit-validation_step.1700000009000.pt.trace.json", 9, 3, 9_000.0, train=False)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert [s.step for s in report.steps] == [5, 6, 7, 8]
    assert report.warnings == [
        "fit-validation_step.1700000009000.pt.trace.json: 3 evaluation step(s) (no backward pass or optimizer step), "
        "beside training steps of the same rank: left out"
    ]
    assert not report.run.partial
    # A run that only evaluates keeps its steps.
    only = torchscope.analyze(run / "fit-validation_step.1700000009000.pt.trace.json", jobs=1, use_cache=False)
    assert [s.step for s in only.steps] == [9, 10, 11] and only.warnings == []


def test_a_real_lightning_capture_is_one_rank() -> None:
    """tests/data/captures/lightning_two_files/README.md: two cycles of one process, named after different
    actions; before, two ranks and a straggler finding between them."""
    capture = Path(__file__).resolve().parents[1] / "data" / "captures" / "lightning_two_files"
    report = torchscope.analyze(capture, jobs=1, use_cache=False)
    assert report.run.ranks == [0] and len(report.run.trace_files) == 2
    # Of the four steps, one holds a validation batch only (analysis/step_kinds.py); the window of the first
    # validation batch holds the training batch's backward and optimizer step before it (Lightning steps
    # the profiler when training_step returns, inside the optimizer's closure), so it trains.
    assert len(report.steps) == 3 and len(report.warnings) == 1 and "evaluation step(s)" in report.warnings[0]
    assert "straggler.rank" not in [f.id for f in report.findings] and not report.distributed.present


def test_evaluation_steps_inside_a_training_span_are_left_out(tmp_path: Path) -> None:
    """analysis/step_kinds.py: Lightning steps the profiler in validation_step too. The evaluation steps
    (forward only, a validation action in them) are left out of the step figures and counted in a warning."""
    b = TraceBuilder()
    for i in range(6):
        start = i * STEP_US
        b.step(i + 5, start, STEP_US - 10)
        b.op("aten::linear", start + 10, 300)
        if i % 3 != 2:  # steps 7 and 10 evaluate
            b.op("autograd::engine::evaluate_function: AddmmBackward0", start + 400, 300)
            b.annotation("Optimizer.step#Adam.step", start + 750, 200)
        else:
            b.annotation(VALIDATION, start + 5, 400)
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert [s.step for s in report.steps] == [5, 6, 8, 9]
    assert report.warnings == ["t.pt.trace.json: 2 evaluation step(s) (no backward pass or optimizer step; 2.0 ms in all), "
                               "beside training steps: left out of the step figures"]
    assert report.phases["optimizer"].us == pytest.approx(200)


def test_forward_only_steps_without_evaluation_evidence_are_training(tmp_path: Path) -> None:
    """Losses of two micro-batches summed before one backward (prof.step() per micro-batch), or RL rollouts
    between updates: steps with no backward are training's cost unless something says they evaluate."""
    b = TraceBuilder()
    for i in range(6):
        start = i * STEP_US
        b.step(i + 5, start, STEP_US - 10)
        b.op("aten::linear", start + 10, 300)
        if i % 2:
            b.op("autograd::engine::evaluate_function: AddmmBackward0", start + 400, 300)
            b.annotation("Optimizer.step#Adam.step", start + 750, 200)
    report = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert [s.step for s in report.steps] == [5, 6, 7, 8, 9, 10] and report.warnings == []


def test_ranks_that_share_a_pid_on_two_nodes_stay_apart(tmp_path: Path) -> None:
    """One container per node gives every rank the same pid; older traces name no host. Files of one
    process follow each other in time, those of two ranks run at the same time."""
    run = tmp_path / "prof"
    _trace(run / "nodeA_38.1700000000000.pt.trace.json", 5, 3, 0.0, pid=38, host=None)
    _trace(run / "nodeB_38.1700000000000.pt.trace.json", 5, 3, 100.0, pid=38, host=None)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0, 1] and [r.worker for r in report.ranks] == ["nodeA_38", "nodeB_38"]


def test_ranks_numbered_by_order_take_numbers_no_other_rank_has(tmp_path: Path) -> None:
    run = tmp_path / "prof"
    _trace(run / "a_ddp.1700000000000.pt.trace.json", 5, 3, 0.0, pid=101, rank=0)
    _trace(run / "fit-training_step.1700000000000.pt.trace.json", 5, 3, 0.0, pid=202)
    _trace(run / "fit-validation_step.1700000009000.pt.trace.json", 9, 3, 9_000.0, pid=202)
    _trace(run / "vm_303.1700000000000.pt.trace.json", 5, 3, 0.0, pid=303)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert [(r.rank, r.worker) for r in report.ranks] == [(0, "a_ddp"), (1, "fit-training_step"), (2, "vm_303")]


def test_one_worker_name_with_two_header_ranks_is_two_ranks(tmp_path: Path) -> None:
    """Every rank writing under one worker name (Lightning's file names carry the local rank only)."""
    run = tmp_path / "prof"
    _trace(run / "trainer.1700000000001.pt.trace.json", 5, 3, 0.0, pid=101, rank=0)
    _trace(run / "trainer.1700000000002.pt.trace.json", 5, 3, 0.0, pid=102, rank=1)
    _trace(run / "trainer.1700000009001.pt.trace.json", 8, 3, 9_000.0, pid=101, rank=0)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0, 1] and sorted((s.rank, s.step) for s in report.steps)[:4] == [(0, 5), (0, 6), (0, 7), (0, 8)]
    assert report.warnings == []


def test_a_rank_whose_files_come_from_two_processes_gets_a_warning(tmp_path: Path) -> None:
    """Two torchrun jobs saved in one folder: each rank number holds two processes' files."""
    run = tmp_path / "prof"
    _trace(run / "job1_rank0.1700000000000.pt.trace.json", 5, 3, 0.0, pid=101, rank=0)
    _trace(run / "job2_rank0.1700000090000.pt.trace.json", 5, 3, 90_000.0, pid=505, rank=0)
    report = torchscope.analyze(run, jobs=1, use_cache=False)
    assert report.run.ranks == [0]
    assert report.warnings == ["rank 0 (job1_rank0): its trace files come from 2 processes (pid 101, 505), read as one "
                               "rank; if they are separate runs, analyse each run's files apart"]
