"""Large embedding tables with dense gradients (analysis/embeddings.py, optimizer.dense_embedding): synthetic
traces recorded the way a CPU step records an nn.Embedding's lookup, dense backward and an Adam update, and
the rule on hand-built Reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rules_support import finding, findings, fixes, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.report.measurements import Embeddings, Measurements
from torchscope.rundir.labels import BACKWARD, FORWARD, OPTIMIZER

STEP_US = 10_000.0
TABLE = [1_000_000, 64]


def _steps(dense: bool = True) -> TraceBuilder:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.annotation(FORWARD, t0 + 100, 1_000)
        b.op("aten::embedding", t0 + 110, 200, **{"Input Dims": [TABLE, [512, 4], [], [], []]})
        b.op("aten::index_select", t0 + 120, 150, **{"Input Dims": [TABLE, [], [2048]]})  # inside the lookup
        b.op("aten::embedding", t0 + 400, 50, **{"Input Dims": [[100, 8], [512]]})  # a small table: not counted
        b.annotation(BACKWARD, t0 + 1_200, 3_000)
        if dense:  # its num_weights (the third input) says which table it is
            b.op("aten::embedding_dense_backward", t0 + 1_300, 2_000, **{"Input Dims": [[512, 4, 64], [512, 4], [], [], []],
                                                                           "Concrete Inputs": ["", "", "1000000", "-1", "False"]})
        else:
            b.op("aten::embedding_sparse_backward", t0 + 1_300, 100, **{"Input Dims": [[512, 4, 64], [512, 4], [], [], []]})
        b.annotation(OPTIMIZER, t0 + 4_500, 5_000)
        b.op("aten::zero_", t0 + 4_510, 500, **{"Input Dims": [TABLE]})  # zero_grad(set_to_none=False)
        b.op("aten::lerp_", t0 + 5_100, 1_000, **{"Input Dims": [TABLE, TABLE, []]})
        b.op("aten::addcdiv_", t0 + 6_200, 1_500, **{"Input Dims": [TABLE, TABLE, TABLE, []]})
        b.op("aten::mul_", t0 + 6_210, 1_400, **{"Input Dims": [TABLE, []]})  # inside the addcdiv_: once
        b.op("aten::addcdiv_", t0 + 8_000, 100, **{"Input Dims": [[256, 256], [256, 256], [256, 256], []]})  # the MLP's
        # A foreach op over a list holding the table and a small tensor: the table's part of its elements.
        b.op("aten::_foreach_sqrt", t0 + 8_200, 1_000, **{"Input Dims": [[TABLE, [4_000_000]]]})
    return b


def test_the_table_its_lookups_and_the_dense_update(tmp_path: Path) -> None:
    rep = torchscope.analyze(_steps().write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.embeddings
    assert section.tables == ["1000000x64"] and section.lookups_per_step == {"1000000x64": 2048.0}
    assert section.dense_tables == ["1000000x64"]
    assert section.dense_update_us_per_step == pytest.approx(2_000 + 500 + 1_000 + 1_500 + 1_000 * 64 / 68)
    f = finding(rep, "optimizer.dense_embedding")
    assert f.title.startswith("The 1000000x64 embedding table is updated whole every step for 2,048 lookups (at most 0.2% of "
                              "its rows): 5.9 ms per step on dense gradients")


def test_a_bag_counts_its_lookups_once_and_a_tied_table_is_no_dense_one(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.op("aten::embedding_bag", t0 + 100, 300, **{"Input Dims": [TABLE, [2048], [512], [], [], [], [], []]})
        b.op("aten::_embedding_bag", t0 + 110, 280, **{"Input Dims": [TABLE, [2048], [512], [], [], [], [], [], []]})
        # The same table as a matmul operand (a language model's output layer tied to it): dense by design.
        b.op("aten::linear", t0 + 500, 300, **{"Input Dims": [[8, 64], TABLE, []]})
        b.op("aten::embedding_dense_backward", t0 + 1_300, 2_000, **{"Input Dims": [[2048, 64], [2048], [], [], []],
                                                                       "Concrete Inputs": ["", "", "1000000", "-1", "False"]})
        b.op("aten::zero_", t0 + 4_510, 500, **{"Input Dims": [TABLE]})
    section = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False).measurements.embeddings
    assert section.lookups_per_step == {"1000000x64": 2048.0}
    assert section.dense_tables == [] and section.dense_update_us_per_step == 0


def test_sparse_gradients_have_no_dense_update(tmp_path: Path) -> None:
    rep = torchscope.analyze(_steps(dense=False).write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    section = rep.measurements.embeddings
    assert section.tables == ["1000000x64"] and section.dense_tables == [] and section.dense_update_us_per_step == 0
    assert "optimizer.dense_embedding" not in findings(rep)


def test_dense_embedding_rule() -> None:
    section = Embeddings(tables=["1000000x64"], lookups_per_step={"1000000x64": 2048.0}, dense_tables=["1000000x64"],
                         dense_update_us_per_step=4_000.0)
    f = finding(report(measurements=Measurements(embeddings=section)), "optimizer.dense_embedding")
    assert (f.category, f.severity, f.time_share) == ("optimizer", "critical", 0.4)
    assert set(fixes(f)) == {"nn.Embedding", "torch.optim.SparseAdam"} and "lazy" in f.recommendation
    # Lookups covering a large part of the table each step: a dense update is no waste.
    busy = Embeddings(tables=["100000x64"], lookups_per_step={"100000x64": 50_000.0}, dense_tables=["100000x64"],
                      dense_update_us_per_step=4_000.0)
    assert "optimizer.dense_embedding" not in findings(report(measurements=Measurements(embeddings=busy)))
    small = Embeddings(tables=["1000000x64"], lookups_per_step={"1000000x64": 2048.0}, dense_tables=["1000000x64"],
                       dense_update_us_per_step=300.0)
    assert "optimizer.dense_embedding" not in findings(report(measurements=Measurements(embeddings=small)))
