"""The loader and the analyses on real traces, checked against independent parses of the same JSON and
against the TensorBoard plugin's published figures (../shared/traces/README.md).

They run on the full traces in ../shared/traces when present, else on the real cuts committed under
tests/data/traces (tests/helpers/real_traces.py); the plugin's figures for the ResNet-50 spans are for the
full files only, so that one test needs ../shared."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import torchscope
from helpers.real_traces import TraceSet, shared_missing_reason, trace_files, trace_set
from torchscope.trace.kinds import Kind, kind_of_category
from torchscope.trace.parse import parse_trace

REAL = trace_set()
ALL_TRACES = [str(p.relative_to(REAL.root)) for p in REAL.files()]


def analyze(path: Path, jobs: int = 1) -> Any:
    return torchscope.analyze(path, jobs=jobs, use_cache=False)


def _raw(path: Path) -> dict:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


@pytest.mark.parametrize("relative", ALL_TRACES)
def test_loader_keeps_every_event_and_the_header(real_traces: TraceSet, relative: str) -> None:
    path = real_traces.root / relative
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




def _full_only(cases: list[str]) -> list[Any]:
    """The cases, or without the full traces one skipped case saying why (not one skip per case)."""
    reason = shared_missing_reason()
    return cases if reason is None else [pytest.param(None, id="full-traces", marks=pytest.mark.skip(reason=reason))]


def _check_breakdown(report: Any, mean_step: float, expected: dict[str, float]) -> None:
    assert report.run.device_kind == "cuda"
    assert np.mean([s.duration_us for s in report.steps]) == pytest.approx(mean_step, rel=0.01)
    for category, percent in expected.items():
        assert report.breakdown[category].percent == pytest.approx(percent, abs=2.0), category
    # The parts of each step add up to the step.
    for step in report.steps:
        assert sum(step.breakdown.values()) == pytest.approx(step.duration_us, rel=1e-6)


@lru_cache(maxsize=2)
def _folder_report(folder: Path) -> Any:
    return analyze(folder)


@pytest.mark.parametrize("relative", _full_only(sorted(TB_UTILIZATION)))
def test_full_resnet50_spans_match_the_tensorboard_plugin(shared_traces: Path, relative: str) -> None:
    """The plugin's figures for each full ResNet-50 file (the committed cuts hold 4 of its 6 steps):
    breakdown within 2 points, GPU utilisation and SM efficiency within 0.5; and the file's span in the
    report of its whole folder has the plugin's data-loading share."""
    path = shared_traces / "gpu" / relative
    mean_step, expected = TB_FIGURES[relative]
    report = analyze(path)
    _check_breakdown(report, mean_step, expected)
    utilization, sm_efficiency = TB_UTILIZATION[relative]
    assert 100 * report.device.utilization == pytest.approx(utilization, abs=0.5)
    assert 100 * report.device.sm_efficiency == pytest.approx(sm_efficiency, abs=0.5)
    assert report.device.tensor_core_kernel_share == 0.0
    assert report.device.achieved_occupancy_pct == pytest.approx(49, abs=1.5)
    spans = {s.file: s.breakdown["data_loading"].percent for s in _folder_report(path.parent).spans}
    assert len(spans) == 2
    assert spans[path.name] == pytest.approx(expected["data_loading"], abs=1.0)


def test_tb_unit_breakdown_matches_tensorboard_plugin_within_2_points(real_traces: TraceSet) -> None:
    relative = "tb_unit/gpu_metrics_input.json"  # a whole copy in tests/data/traces
    _check_breakdown(analyze(real_traces.folder("tb_unit") / "gpu_metrics_input.json"), *TB_FIGURES[relative])


def test_num_workers_0_diagnosed_as_data_loading_pooled_over_spans(real_traces: TraceSet) -> None:
    folder = real_traces.folder("resnet50_num_workers_0")
    report = analyze(folder)
    top = report.findings[0]
    assert top.category == "data_loading" and top.severity in ("warning", "critical")
    assert top.evidence["num_workers_zero"] is True
    assert sorted(s.file for s in report.spans) == [p.name for p in trace_files(folder)]  # one span per file
    # Pooled over every span's steps: total exposed data-loading time / total step time.
    steps = report.steps
    pooled = sum(s.breakdown["data_loading"] for s in steps) / sum(s.duration_us for s in steps)
    assert top.evidence["exposed_us_per_step"] / report.mean_step_us == pytest.approx(pooled, abs=1e-3)
    # The what-if saving: removing the loader from the host frees the idle time it causes (its exposed
    # time, the TensorBoard plugin's DataLoader figure), less what a loader with workers still costs.
    assert top.time_share_low <= top.time_share <= top.time_share_high
    assert top.time_share_high == pytest.approx(pooled, abs=0.02)
    # The SGD for-loop's host time mostly overlaps kernels still running: it costs less than it takes.
    optimizer = next(f for f in report.findings if f.id == "optimizer.step")
    assert optimizer.time_share < optimizer.evidence["optimizer_us_per_step"] / report.mean_step_us
    assert optimizer.time_share < top.time_share


def test_num_workers_4_has_no_data_loading_warning(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("resnet50_num_workers_4"))
    assert not [f for f in report.findings if f.category == "data_loading" and f.severity != "info"]
    # Like the plugin, it recommends tensor cores (AMP) for these FP32 convolutions.
    assert any(f.id == "compute.tensor_cores_unused" for f in report.findings)


def test_operator_device_time_accounts_for_every_device_op(real_traces: TraceSet) -> None:
    path = real_traces.file("resnet50_num_workers_0")  # worker0.1623143089861, full or steps 5-8
    raw = _raw(path)["traceEvents"]
    device_total = sum(e["dur"] for e in raw if e.get("cat") in ("Kernel", "Memcpy", "Memset"))
    assert device_total > 0
    report = analyze(path)
    assert sum(op.device_self_us for op in report.operators) == pytest.approx(device_total)
    conv = next(op for op in report.operators if op.name == "aten::cudnn_convolution")
    expected_calls = sum(1 for e in raw if e.get("name") == "aten::cudnn_convolution" and e.get("ph") == "X")
    assert conv.calls == expected_calls > 0


def test_two_rank_nccl_traces_give_two_ranks_and_communication(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("hta_two_ranks_nccl"), jobs=2)
    assert report.run.ranks == [0, 1]
    assert {r.rank for r in report.ranks} == {0, 1}
    assert report.breakdown["communication"].percent > 10
    assert any(f.category == "communication" for f in report.findings)


def test_trace_without_steps_says_so(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("alexnet_sync"))
    assert report.run.step_source == "whole_trace"
    assert any(f.id == "trace_quality.no_steps" for f in report.findings)


def test_cpu_only_gloo_trace(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("hta_cpu_only_gloo"))
    assert report.run.device_kind == "cpu"
    assert set(report.breakdown) == {"data_loading", "forward", "backward", "optimizer", "communication", "other"}
    assert any(f.id == "trace_quality.few_steps" for f in report.findings)


def test_rocm_trace_is_recognised(real_traces: TraceSet) -> None:
    report = analyze(real_traces.folder("rocm_mi250"))
    assert report.run.device_kind == "rocm"
    assert report.kernels
