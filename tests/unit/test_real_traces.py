"""The loader and the analyses on the real traces in ../shared/traces, checked against independent
parses of the same JSON and against the TensorBoard plugin's published figures (traces/README.md)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from torchscope.report.build import analyze
from torchscope.trace.kinds import Kind, kind_of_category
from torchscope.trace.parse import parse_trace

ALL_TRACES = sorted(
    str(p.relative_to(p.parents[2])) for p in (Path(__file__).resolve().parents[2].parent / "shared" / "traces").glob("*/*/*.json*")
)


def _raw(path: Path) -> dict:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


@pytest.mark.parametrize("relative", ALL_TRACES)
def test_loader_keeps_every_event_and_the_header(shared_traces: Path, relative: str) -> None:
    path = shared_traces / relative
    raw = _raw(path)
    trace = parse_trace(path)
    events = raw["traceEvents"]
    assert len(trace.events) == len(events)
    assert set(trace.header) == set(raw) - {"traceEvents"}
    expected_kernels = sum(1 for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel")
    assert int((trace.events.kind == Kind.KERNEL).sum()) == expected_kernels
    # Unknown categories are kept as OTHER, not dropped.
    unknown = sum(1 for e in events if e.get("ph") == "X" and kind_of_category(str(e.get("cat", ""))) == Kind.OTHER)
    assert int(((trace.events.kind == Kind.OTHER)).sum()) >= unknown
    names = Counter(trace.events.text(trace.events.name))
    assert names == Counter(str(e.get("name", "")) for e in events)
    ts = np.array([float(e.get("ts", "nan")) for e in events])
    assert np.allclose(np.sort(trace.events.ts_us), np.sort(ts[np.isfinite(ts)]))


# TensorBoard plugin Overview figures per span (percent of step), from ../shared/traces/README.md.
TB_FIGURES = {
    "resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": (177_592, {"kernel": 55.51, "memcpy": 1.08, "memset": 0.05, "runtime": 1.64, "data_loading": 33.37, "cpu_exec": 7.70, "other": 0.65}),
    "resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz": (154_911, {"kernel": 63.61, "memcpy": 1.12, "memset": 0.06, "runtime": 2.62, "data_loading": 22.92, "cpu_exec": 8.90, "other": 0.78}),
    "resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz": (141_068, {"kernel": 70.28, "memcpy": 2.24, "memset": 0.07, "runtime": 7.49, "data_loading": 0.84, "cpu_exec": 16.07, "other": 3.01}),
    "resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz": (142_808, {"kernel": 69.35, "memcpy": 2.02, "memset": 0.07, "runtime": 7.41, "data_loading": 0.20, "cpu_exec": 10.02, "other": 10.92}),
    "tb_unit/gpu_metrics_input.json": (13_410, {"kernel": 0.36, "memcpy": 0.01, "runtime": 4.62, "data_loading": 5.41, "cpu_exec": 65.21, "other": 24.39}),
}
TB_UTILIZATION = {
    "resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": (55.51, 54.68),
    "resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz": (63.61, 62.65),
    "resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz": (70.27, 69.22),
    "resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz": (69.35, 68.32),
}


@pytest.mark.parametrize("relative", sorted(TB_FIGURES))
def test_breakdown_matches_tensorboard_plugin_within_2_points(shared_traces: Path, relative: str) -> None:
    mean_step, expected = TB_FIGURES[relative]
    report = analyze(shared_traces / "gpu" / relative, jobs=1, use_cache=False)
    assert report.run.device_kind == "cuda"
    assert np.mean([s.duration_us for s in report.steps]) == pytest.approx(mean_step, rel=0.01)
    for category, percent in expected.items():
        assert report.breakdown[category].percent == pytest.approx(percent, abs=2.0), category
    # The parts of each step add up to the step.
    for step in report.steps:
        assert sum(step.breakdown.values()) == pytest.approx(step.duration_us, rel=1e-6)


@pytest.mark.parametrize("relative", sorted(TB_UTILIZATION))
def test_gpu_utilization_and_sm_efficiency_match_the_plugin(shared_traces: Path, relative: str) -> None:
    utilization, sm_efficiency = TB_UTILIZATION[relative]
    report = analyze(shared_traces / "gpu" / relative, jobs=1, use_cache=False)
    assert 100 * report.device.utilization == pytest.approx(utilization, abs=0.5)
    assert 100 * report.device.sm_efficiency == pytest.approx(sm_efficiency, abs=0.5)
    assert report.device.tensor_core_kernel_share == 0.0
    assert report.device.achieved_occupancy_pct == pytest.approx(49, abs=1.5)


def test_num_workers_0_diagnosed_as_data_loading_per_span_and_pooled(shared_traces: Path) -> None:
    folder = shared_traces / "gpu" / "resnet50_num_workers_0"
    report = analyze(folder, jobs=1, use_cache=False)
    top = report.findings[0]
    assert top.category == "data_loading" and top.severity in ("warning", "critical")
    assert top.evidence["num_workers_zero"] is True
    spans = {s.file: s.breakdown["data_loading"].percent for s in report.spans}
    assert spans["worker0.1623143089861.pt.trace.json.gz"] == pytest.approx(33.37, abs=1.0)
    assert spans["worker0.1623143566756.pt.trace.json.gz"] == pytest.approx(22.92, abs=1.0)
    # Pooled over both spans' steps: total exposed data-loading time / total step time.
    steps = report.steps
    pooled = sum(s.breakdown["data_loading"] for s in steps) / sum(s.duration_us for s in steps)
    assert top.time_share == pytest.approx(pooled, abs=1e-3)


def test_num_workers_4_has_no_data_loading_warning(shared_traces: Path) -> None:
    report = analyze(shared_traces / "gpu" / "resnet50_num_workers_4", jobs=1, use_cache=False)
    assert not [f for f in report.findings if f.category == "data_loading" and f.severity != "info"]
    # Like the plugin, it recommends tensor cores (AMP) for these FP32 convolutions.
    assert any(f.id == "compute.tensor_cores_unused" for f in report.findings)


def test_operator_device_time_accounts_for_every_device_op(shared_traces: Path) -> None:
    path = shared_traces / "gpu" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
    raw = _raw(path)["traceEvents"]
    device_total = sum(e["dur"] for e in raw if e.get("cat") in ("Kernel", "Memcpy", "Memset"))
    report = analyze(path, jobs=1, use_cache=False)
    assert sum(op.device_self_us for op in report.operators) == pytest.approx(device_total)
    conv = next(op for op in report.operators if op.name == "aten::cudnn_convolution")
    expected_calls = sum(1 for e in raw if e.get("name") == "aten::cudnn_convolution" and e.get("ph") == "X")
    assert conv.calls == expected_calls


def test_two_rank_nccl_traces_give_two_ranks_and_communication(shared_traces: Path) -> None:
    report = analyze(shared_traces / "gpu" / "hta_two_ranks_nccl", jobs=2, use_cache=False)
    assert report.run.ranks == [0, 1]
    assert {r.rank for r in report.ranks} == {0, 1}
    assert report.breakdown["communication"].percent > 10
    assert any(f.category == "communication" for f in report.findings)


def test_trace_without_steps_says_so(shared_traces: Path) -> None:
    report = analyze(shared_traces / "gpu" / "alexnet_sync", jobs=1, use_cache=False)
    assert report.run.step_source == "whole_trace"
    assert any(f.id == "trace_quality.no_steps" for f in report.findings)


def test_cpu_only_gloo_trace(shared_traces: Path) -> None:
    report = analyze(shared_traces / "cpu" / "hta_cpu_only_gloo", jobs=1, use_cache=False)
    assert report.run.device_kind == "cpu"
    assert set(report.breakdown) == {"data_loading", "forward", "backward", "optimizer", "communication", "other"}
    assert any(f.id == "trace_quality.few_steps" for f in report.findings)


def test_rocm_trace_is_recognised(shared_traces: Path) -> None:
    report = analyze(shared_traces / "gpu" / "rocm_mi250", jobs=1, use_cache=False)
    assert report.run.device_kind == "rocm"
    assert report.kernels
