"""Attention computed op by op (analysis/attention.py, compute.unfused_attention): synthetic traces recorded
the way a training step records written-out attention (matmul, scale, masked_fill, softmax, dropout, matmul,
and the backward), SDPA, nn.MultiheadAttention's need_weights path and GPU kernels; the rule on hand-built
Reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_rules_support import finding, findings, fixes, gpu, report

import torchscope
from helpers.trace_builder import TraceBuilder
from torchscope.report.measurements import Attention, Measurements

STEP_US = 10_000.0
SCORES = [2, 4, 128, 128]  # batch, heads, queries, keys
Q = [2, 4, 128, 16]


def _dims(*shapes: list[int]) -> dict[str, Any]:
    return {"Input Dims": list(shapes)}


def _attention_step(b: TraceBuilder, t0: float, *, dropout_p: str | None = "0.1", on_gpu: bool = False,
                     activation: list[int] | None = None, frame: str | None = "model.py(31): forward",
                     softmax_dim: str = "-1") -> None:
    """One step of written-out attention: each score op's self time is known (its children are listed)."""
    def op(name: str, ts: float, dur: float, *shapes: list[int], **args: Any) -> None:
        b.op(name, t0 + ts, dur, **_dims(*shapes), **args)
        if on_gpu and name in ("aten::mul", "aten::masked_fill_", "aten::_softmax", "aten::_softmax_backward_data"):
            b.launch(t0 + ts + 1, 5, t0 + ts + 10, 100)  # one kernel of 100 us each

    if frame is not None:  # the forward's Python frame (recorded stacks)
        b.op(frame, t0 + 50, 4_900, cat="python_function")
    op("aten::linear", 100, 1_000, activation or [2, 128, 64], [192, 64], [192])
    op("aten::matmul", 1_200, 400, Q, [2, 4, 16, 128])
    op("aten::bmm", 1_220, 350, [8, 128, 16], [8, 16, 128])
    op("aten::mul", 1_700, 300, SCORES, [])
    op("aten::masked_fill", 2_100, 500, SCORES, [1, 1, 128, 128], [])  # self 50
    op("aten::clone", 2_110, 200, SCORES, [])  # self 20
    op("aten::copy_", 2_115, 180, SCORES, SCORES, [])
    op("aten::masked_fill_", 2_320, 250, SCORES, [1, 1, 128, 128], [])
    op("aten::softmax", 2_700, 400, SCORES, [], [], **{"Concrete Inputs": ["", softmax_dim, ""]})  # self 20
    op("aten::_softmax", 2_710, 380, SCORES, [], [], **{"Concrete Inputs": ["", "3" if softmax_dim == "-1" else softmax_dim, "False"]})
    # Dropout on the scores: its mask is kept by fused attention too, not counted.
    op("aten::dropout", 3_200, 600, SCORES, [], [], **({"Concrete Inputs": ["", dropout_p, "True"]} if dropout_p else {}))
    op("aten::bernoulli_", 3_210, 400, SCORES, [], [])
    op("aten::mul", 3_620, 150, SCORES, SCORES)
    op("aten::matmul", 3_900, 400, SCORES, Q)
    op("aten::bmm", 3_910, 380, [8, 128, 128], [8, 128, 16])
    op("SoftmaxBackward0", 5_000, 300, SCORES)  # self 20
    op("aten::_softmax_backward_data", 5_010, 280, SCORES, SCORES, [], [])
    op("BmmBackward0", 5_400, 500, [8, 128, 16])
    op("aten::bmm", 5_410, 480, [8, 128, 16], [8, 16, 128])
    op("aten::softmax", 6_000, 100, [256, 10], [], [])  # a classifier's softmax: 2-d, no attention


def _trace(tmp_path: Path, **kwargs: Any) -> torchscope.Report:
    b = TraceBuilder().gpu() if kwargs.get("on_gpu") else TraceBuilder()
    for i in range(3):
        b.step(i + 5, i * STEP_US, STEP_US)
        _attention_step(b, i * STEP_US, **kwargs)
    return torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)


def test_written_out_attention_and_its_score_ops(tmp_path: Path) -> None:
    rep = _trace(tmp_path)
    # The score ops: scale 300 + masked_fill 500 (with its clone and copy) + softmax 400 + its backward 300.
    assert rep.measurements.attention == Attention(
        calls_per_step=1.0, score_shapes=["8x128x128"], score_us_per_step=1_500.0, calls_with_stacks_per_step=1.0,
        dropout_calls_per_step=1.0,
    )
    f = finding(rep, "compute.unfused_attention")
    assert f.title.startswith("Attention is computed op by op: 1 softmax(es) per step over materialised scores (8x128x128)")
    assert f.time_share_low == 0.0  # a CPU trace with attention dropout: SDPA would take its math path
    assert list(fixes(f)) == ["torch.nn.functional.scaled_dot_product_attention"]


def test_dropout_with_p_zero_is_no_attention_dropout(tmp_path: Path) -> None:
    section = _trace(tmp_path, dropout_p="0.").measurements.attention
    assert (section.calls_per_step, section.dropout_calls_per_step, section.dropout_p_unknown_calls_per_step) == (1.0, 0.0, 0.0)


def test_dropout_without_concrete_inputs_is_unknown(tmp_path: Path) -> None:
    rep = _trace(tmp_path, dropout_p=None)
    section = rep.measurements.attention
    assert (section.dropout_calls_per_step, section.dropout_p_unknown_calls_per_step) == (0.0, 1.0)
    f = finding(rep, "compute.unfused_attention")
    assert f.time_share_low is not None and f.time_share_low > 0 and "a p the trace does not record" in f.recommendation


def test_a_softmax_over_another_axis_is_no_attention(tmp_path: Path) -> None:
    # Slot attention normalises over the slots (the queries): no fused attention computes that.
    rep = _trace(tmp_path, softmax_dim="1")
    assert rep.measurements.attention == Attention() and "compute.unfused_attention" not in findings(rep)


def test_mask_first_ops_count(tmp_path: Path) -> None:
    # torch.where(mask, att, min) (Hugging Face's eager GPT-2) has the mask first: still a score op.
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        _attention_step(b, t0)
        b.op("aten::where", t0 + 7_000, 250, **_dims([1, 1, 128, 128], SCORES, []))
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.attention.score_us_per_step == 1_750.0


def test_a_score_shape_that_is_also_an_activation_is_left_out(tmp_path: Path) -> None:
    # One head, as many features as tokens: a linear layer's input has the scores' shape.
    rep = _trace(tmp_path, activation=[8, 128, 128])
    assert rep.measurements.attention == Attention() and "compute.unfused_attention" not in findings(rep)


def test_without_stacks_both_fixes_are_offered(tmp_path: Path) -> None:
    rep = _trace(tmp_path, frame=None)
    assert rep.measurements.attention.calls_with_stacks_per_step == 0.0
    f = finding(rep, "compute.unfused_attention")
    assert list(fixes(f)) == ["torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention"]
    assert "does not say which" in f.recommendation


def test_gpu_attention_counts_the_kernels(tmp_path: Path) -> None:
    section = _trace(tmp_path, on_gpu=True).measurements.attention
    assert (section.time_base, section.score_us_per_step) == ("device", 400.0)


def test_need_weights_path_of_multihead_attention(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        _attention_step(b, t0, frame="torch/nn/functional.py(6231): multi_head_attention_forward")
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.attention.need_weights_calls_per_step == 1.0
    f = finding(rep, "compute.unfused_attention")
    assert fixes(f) == {"torch.nn.MultiheadAttention": ("code_change", "out, _ = attn(q, k, v, need_weights=False)")}
    # One MultiheadAttention beside attention written out: both fixes, each for its calls.
    mixed = Attention(calls_per_step=2.0, calls_with_stacks_per_step=2.0, need_weights_calls_per_step=1.0, score_us_per_step=2_000.0)
    f = finding(report(measurements=Measurements(attention=mixed)), "compute.unfused_attention")
    assert list(fixes(f)) == ["torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention"]
    assert "Some calls come from nn.MultiheadAttention" in f.recommendation


def test_sdpa_and_its_math_path_are_fused_calls(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(3):
        t0 = i * STEP_US
        b.step(i + 5, t0, STEP_US)
        b.op("aten::scaled_dot_product_attention", t0 + 100, 2_000, **_dims(Q, Q, Q))
        b.op("aten::_scaled_dot_product_attention_math", t0 + 110, 1_900, **_dims(Q, Q, Q))
        b.op("aten::matmul", t0 + 120, 400, **_dims(Q, [2, 4, 16, 128]))
        b.op("aten::_safe_softmax", t0 + 600, 400, **_dims(SCORES, [], []))
        b.op("aten::matmul", t0 + 1_100, 400, **_dims(SCORES, Q))
        b.op("aten::_scaled_dot_product_flash_attention_for_cpu_backward", t0 + 3_000, 3_000, **_dims(Q, Q, Q, Q))
    rep = torchscope.analyze(b.write(tmp_path / "t.pt.trace.json"), jobs=1, use_cache=False)
    assert rep.measurements.attention == Attention(fused_calls_per_step=1.0)
    assert "compute.unfused_attention" not in findings(rep)


def test_unfused_attention_rule() -> None:
    section = Attention(calls_per_step=12.0, calls_with_stacks_per_step=12.0, score_shapes=["96x512x512"], score_us_per_step=2_000.0)
    f = finding(report(measurements=Measurements(attention=section)), "compute.unfused_attention")
    # 20 % of the step in score ops: fused attention saves that, within half of it to twice it.
    assert f.severity == "warning" and f.time_share == pytest.approx(0.2)
    assert (f.time_share_low, f.time_share_high) == (pytest.approx(0.1), pytest.approx(0.4))
    assert f.evidence["score_ops_us_per_step"] == 2_000.0 and "materialises" in f.recommendation
    assert list(fixes(f)) == ["torch.nn.functional.scaled_dot_product_attention"]
    # On a GPU with attention dropout the fused kernels still apply: the low end stays.
    on_gpu = Attention(score_us_per_step=2_000.0, calls_per_step=12.0, calls_with_stacks_per_step=12.0,
                       dropout_calls_per_step=12.0, time_base="device")
    assert finding(report(measurements=Measurements(attention=on_gpu), device=gpu()), "compute.unfused_attention").time_share_low == pytest.approx(0.1)
    small = Attention(calls_per_step=12.0, score_us_per_step=400.0)
    assert "compute.unfused_attention" not in findings(report(measurements=Measurements(attention=small)))
    assert "compute.unfused_attention" not in findings(report(measurements=Measurements(attention=Attention(fused_calls_per_step=12.0))))
