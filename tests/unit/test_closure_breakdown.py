"""Host-phase breakdown of closure-based optimizer steps (issue 13), on synthetic traces.

`optimizer.step(closure)` runs forward and backward inside torch's `Optimizer.step#` range; the capture
labels the closure (`torchscope:closure`) and suspends its optimizer label meanwhile.
"""

from __future__ import annotations

import json

import pytest

from helpers.phase_shares import phase_shares
from helpers.trace_builder import TraceBuilder
from torchscope.trace.parse import parse_trace_bytes


def _closure_step(b: TraceBuilder, t0: float, labels: bool) -> None:
    """One 1000 us step: Optimizer.step 0-1000 holding a closure 100-900 (zero_grad 100-150, forward
    150-450, loss 450-500, backward 500-900), optimizer work 0-100 and 900-1000."""
    b.step(1 + int(t0 // 1000), t0, 1000)
    b.annotation("Optimizer.step#LBFGS.step", t0, 1000)
    if labels:
        b.annotation("torchscope:optimizer", t0 + 1, 99)
        b.annotation("torchscope:closure", t0 + 100, 800)
        b.annotation("torchscope:forward", t0 + 150, 300)
        b.annotation("torchscope:backward", t0 + 500, 400)
        b.annotation("torchscope:optimizer", t0 + 900, 99)
    b.annotation("Optimizer.zero_grad#LBFGS.zero_grad", t0 + 100, 50)
    b.op("aten::addmm", t0 + 150, 300)
    b.op("aten::mse_loss", t0 + 450, 50)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 500, 400)
    b.op("aten::dot", t0 + 910, 80)


def test_closure_time_is_not_the_optimizers() -> None:
    b = TraceBuilder()
    for t0 in (0.0, 1000.0, 2000.0):
        _closure_step(b, t0, labels=True)
    shares = phase_shares(b)
    assert shares["optimizer"] == pytest.approx(0.25)  # 0-100, 900-1000, and zero_grad 100-150 in the closure
    assert shares["backward"] == pytest.approx(0.40)
    assert shares["forward"] == pytest.approx(0.35)  # the model, and the loss computed in the closure
    assert shares["other"] == pytest.approx(0.0)


def test_without_labels_the_closures_forward_is_forward() -> None:
    # A plain torch.profiler trace of Lightning or LBFGS: the backward inside Optimizer.step marks a closure,
    # whose ops before that backward are its forward; zero_grad's range stays the optimizer's.
    b = TraceBuilder()
    for t0 in (0.0, 1000.0, 2000.0):
        _closure_step(b, t0, labels=False)
    shares = phase_shares(b)
    assert shares["backward"] == pytest.approx(0.40)
    assert shares["forward"] == pytest.approx(0.35)
    assert shares["optimizer"] == pytest.approx(0.25)


def test_an_optimizer_step_without_closure_is_unchanged() -> None:
    b = TraceBuilder()
    for i, t0 in enumerate((0.0, 1000.0, 2000.0)):
        b.step(i + 1, t0, 1000)
        b.annotation("torchscope:forward", t0, 400)
        b.annotation("torchscope:backward", t0 + 400, 400)
        b.annotation("Optimizer.step#SGD.step", t0 + 800, 200)
        b.annotation("torchscope:optimizer", t0 + 801, 198)
    shares = phase_shares(b)
    assert (shares["forward"], shares["backward"], shares["optimizer"]) == pytest.approx((0.4, 0.4, 0.2))


def test_optimizer_measurements_leave_the_closure_out() -> None:
    """measurements.optimizer (host.optimizer_details): the closure's ops and time are not the step's."""
    from torchscope.analysis.host import optimizer_details
    from torchscope.analysis.span import SpanInput

    b = TraceBuilder()
    for t0 in (0.0, 1000.0, 2000.0):
        _closure_step(b, t0, labels=True)
        b.op("aten::add_", t0 + 50, 10)  # the update itself, before the closure
        b.op("aten::mul_", t0 + 650, 10)  # inside the backward: the closure's, not the optimizer's
    span = SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))
    details = optimizer_details(span.events, span.steps, span.tree, span.times)
    assert details.step_us_per_step == pytest.approx(200.0)  # 0-100 and 900-1000
    assert details.per_param_ops_per_step == pytest.approx(1.0)


def test_what_if_optimizer_cause_leaves_the_closure_out() -> None:
    """The what-if model's optimizer_step cause (what a foreach/fused optimizer could save) is the step's own time."""
    from torchscope.analysis import intervals
    from torchscope.analysis.span import SpanInput
    from torchscope.analysis.whatif import cause_sets

    b = TraceBuilder()
    for t0 in (0.0, 1000.0, 2000.0):
        _closure_step(b, t0, labels=True)
    span = SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))
    assert intervals.total_length(cause_sets(span)["optimizer_step"]) == pytest.approx(3 * 200.0)
