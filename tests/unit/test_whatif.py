"""The what-if savings model (analysis/whatif.py) on synthetic GPU traces with a known answer, its
queue scan against a plain loop, and the ranking it gives on the real ResNet-50 traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import torchscope
from helpers.real_traces import TraceSet
from helpers.trace_builder import TraceBuilder
from torchscope.analysis import whatif
from torchscope.report.model import Report

STEP_US = 10_000.0
STEPS = 4
LOOP_US = 3000.0  # the host optimizer loop: 30 launches of 100 us
LAUNCHES = 30


def _optimizer_steps(backward_kernel_us: float) -> TraceBuilder:
    """Steps of: a backward kernel launched at the start, then a per-parameter optimizer loop on the host
    (LAUNCHES tiny kernels, one per 100 us), then a loss kernel the host waits for, then the next step."""
    b = TraceBuilder().gpu()
    for i in range(STEPS):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.launch(t0 + 10, 10, t0 + 30, backward_kernel_us, name="void conv_backward()")
        b.op("Optimizer.step#SGD.step", t0 + 100, LOOP_US, cat="user_annotation")
        backward_end = t0 + 30 + backward_kernel_us
        for k in range(LAUNCHES):
            launch = t0 + 100 + k * (LOOP_US / LAUNCHES)
            b.op("aten::add_", launch, 90)
            start = max(launch + 10, backward_end + k * 5)  # queued behind the backward kernel, 5 us each
            b.launch(launch + 2, 8, start, 5, name="void add_kernel()")
        # Then the host launches the loss kernel at 9 ms and reads it (`loss.item()`): it waits until the
        # device has drained, so a host that runs ahead of a busy device waits there instead.
        loss_start = max(t0 + 9020, backward_end + LAUNCHES * 5 + 5)
        b.launch(t0 + 9000, 10, loss_start, 200, name="void loss_kernel()")
        b.runtime("cudaStreamSynchronize", t0 + 9015, max(loss_start + 200 - (t0 + 9015), 5))
    return b


def _report(builder: TraceBuilder, tmp_path: Path) -> Report:
    return torchscope.analyze(builder.write(tmp_path / "trace.pt.trace.json"), jobs=1, use_cache=False)


def test_an_optimizer_loop_hidden_behind_kernels_costs_about_nothing(tmp_path: Path) -> None:
    # The backward kernel runs 8.9 ms, far past the loop's 3 ms: the GPU never waits for the loop.
    report = _report(_optimizer_steps(backward_kernel_us=8900), tmp_path)
    savings = report.measurements.savings
    assert savings.model == "device_replay"
    assert savings.modelled_step_us == pytest.approx(savings.measured_step_us, rel=0.01)
    assert savings.saved_us_per_step_high["optimizer_step"] == pytest.approx(0.0, abs=0.001 * STEP_US)
    optimizer = next(f for f in report.findings if f.id == "optimizer.step")
    assert optimizer.time_share == pytest.approx(0.0, abs=1e-3) and optimizer.severity == "info"


def test_the_same_loop_with_an_idle_device_costs_its_idle_time(tmp_path: Path) -> None:
    # The backward kernel ends at 230 us, so the GPU idles through the loop, waiting for each tiny launch;
    # after the loop the host waits in the sync only for the short loss kernel, so it keeps the gain.
    report = _report(_optimizer_steps(backward_kernel_us=200), tmp_path)
    savings = report.measurements.savings
    # Shrinking the loop to a kept fraction k moves everything after it earlier by (1 - k) x 3 ms.
    low_kept, high_kept = whatif.KEPT["optimizer_step"]
    assert savings.saved_us_per_step_high["optimizer_step"] == pytest.approx((1 - high_kept) * LOOP_US, rel=0.02)
    assert savings.saved_us_per_step_low["optimizer_step"] == pytest.approx((1 - low_kept) * LOOP_US, rel=0.02)
    optimizer = next(f for f in report.findings if f.id == "optimizer.step")
    assert optimizer.time_share_low == pytest.approx((1 - low_kept) * LOOP_US / STEP_US, abs=2e-3)
    assert optimizer.time_share_high == pytest.approx((1 - high_kept) * LOOP_US / STEP_US, abs=2e-3)
    assert optimizer.severity == "warning"


def test_the_queue_scan_matches_a_plain_loop() -> None:
    rng = np.random.default_rng(0)
    n = 500
    stream = np.sort(rng.integers(0, 4, n))
    ready = rng.uniform(0, 1000, n)
    dur = rng.uniform(0, 20, n)
    carry = np.array([50.0, -np.inf, 900.0, 10.0])
    expected = np.empty(n)
    last = dict(enumerate(carry.tolist()))
    for k in range(n):
        expected[k] = max(ready[k], last[int(stream[k])]) + dur[k]
        last[int(stream[k])] = expected[k]
    assert np.allclose(whatif._scan(ready, dur, stream, carry), expected)


def test_a_sync_waits_for_the_device_and_its_removal_saves_the_wait(tmp_path: Path) -> None:
    b = TraceBuilder().gpu()
    for i in range(STEPS):
        t0 = i * STEP_US
        b.step(i, t0, STEP_US)
        b.launch(t0 + 10, 10, t0 + 30, 2000)
        b.runtime("cudaDeviceSynchronize", t0 + 30, 2000)  # waits for the kernel (ends at t0 + 2030)
        b.launch(t0 + 2040, 10, t0 + 2060, 100)
    savings = _report(b, tmp_path).measurements.savings
    assert savings.modelled_step_us == pytest.approx(STEP_US, rel=0.01)
    # Without the wait the host reaches the step's end 2 ms (less the call's fixed cost) sooner.
    assert savings.saved_us_per_step_high["sync"] == pytest.approx(2000 - whatif.SYNC_FIXED_US, rel=0.01)


def test_num_workers_0_ranks_data_loading_first_on_the_full_resnet50_spans(shared_traces: Path) -> None:
    for file in sorted((shared_traces / "gpu" / "resnet50_num_workers_0").glob("*.json.gz")):
        report = torchscope.analyze(file)
        assert report.findings[0].id == "data_loading.exposed", [(f.id, f.time_share) for f in report.findings]


def test_data_loading_ranks_first_on_the_committed_resnet50_cut(real_traces: TraceSet) -> None:
    report = torchscope.analyze(real_traces.file("resnet50_num_workers_0"))
    assert report.findings[0].id == "data_loading.exposed"
    assert report.measurements.savings.modelled_step_us == pytest.approx(report.measurements.savings.measured_step_us, rel=0.01)
