"""The measurement sections (report/measurements.py) as registered analyses: each extracts its typed
section per span and merges the spans' sections by the rules its fields declare."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional

import msgspec

from torchscope.analysis import anomaly, attention, compilation, dropout, embeddings, float64, garbage_collection, grad_sync, graph_breaks, host, module_hooks, patterns, recompute, whatif
from torchscope.analysis.reduce import merge_sections
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.report import measurements as m


def launch(s: SpanInput) -> m.LaunchOverhead | None:
    return host.launch_overhead(s.events, s.steps)


def sync(s: SpanInput) -> m.Synchronization:
    return host.synchronization(s.events, s.steps, s.tree, s.times)


def copies(s: SpanInput) -> m.Copies:
    return host.host_to_device_copies(s.events, s.steps)


def optimizer(s: SpanInput) -> m.Optimizer:
    return host.optimizer_details(s.events, s.steps, s.tree, s.times)


def dispatch(s: SpanInput) -> m.Dispatch | None:
    # Main-thread dispatch figures mean something on CPU traces only (GPU backward runs on another thread).
    if s.has_device:
        return None
    figures = host.dispatch_overhead(s.events, s.steps, s.tree, s.times, s.compute_set)
    work = s.arithmetic
    unit_us, unit_gflop = work.units_within(s.events, s.compute_set)
    large_us, large_gflop = work.large(s.events.dur_us)
    # No large unit: the rule keeps the matrix multiplies at the capture's measured matmul rate.
    unrated_us, unrated_gflop = work.units_within(s.events, s.compute_set, work.matmul_family(s.events)) if large_us == 0 else (0.0, 0.0)
    n = max(len(s.steps), 1)
    return msgspec.structs.replace(
        figures, forward_passes_per_step=host.forward_passes(s.events, s.steps) / n, matmul_us_per_step=unit_us / n, matmul_gflop_per_step=unit_gflop / n,
        matmul_large_us_per_step=large_us / n, matmul_large_gflop_per_step=large_gflop / n,
        matmul_unrated_us_per_step=unrated_us / n, matmul_unrated_gflop_per_step=unrated_gflop / n,
    )  # fmt: skip


def outside_steps(s: SpanInput) -> m.OutsideSteps:
    return host.outside_phases(s.events, s.steps, s.tree, s.phase_sets["other"])


def compile_(s: SpanInput) -> m.Compile:
    return compilation.compile_activity(s.events, s.steps, s.compute_set)


def dataloader(s: SpanInput) -> m.DataLoader:
    return host.dataloader_kind(s.events, s.steps, s.tree)


def idle(s: SpanInput) -> m.DeviceIdle:
    if not s.has_device:
        return m.DeviceIdle(host_ops_us_per_step=s.device.gap_host_ops)
    return m.DeviceIdle(
        idle_us_per_step=float(s.device.idle_us_per_step.mean()) if len(s.steps) else 0.0,
        explained_us_per_step=host.idle_explained_us_per_step(s.events, s.steps, s.device.busy),
        host_ops_us_per_step=s.device.gap_host_ops,
    )


def anomaly_mode(s: SpanInput) -> m.AnomalyMode | None:
    return anomaly.anomaly_mode(s.events, s.steps, s.tree)


def gc(s: SpanInput) -> m.GarbageCollection | None:
    return garbage_collection.garbage_collection(s.events, s.steps, s.tree)


def _reduce(name: str, parts: list[Part[Optional[m.Section]]]) -> dict[str, Any]:
    return {f"measurements.{name}": merge_sections(parts, m.SECTION_TYPES[name])}


def _section(name: str, extract: Callable[[SpanInput], Optional[m.Section]]) -> Analysis[Optional[m.Section]]:
    return Analysis(
        name=f"measurements.{name}",
        extract=extract,
        extract_type=Optional[m.SECTION_TYPES[name]],
        reduce=partial(_reduce, name),
        fills=(f"measurements.{name}",),
    )


SECTIONS: tuple[Analysis[Any], ...] = (
    _section("launch", launch),
    _section("sync", sync),
    _section("copies", copies),
    _section("optimizer", optimizer),
    _section("dispatch", dispatch),
    _section("outside_steps", outside_steps),
    _section("compile", compile_),
    _section("dataloader", dataloader),
    _section("idle", idle),
    _section("savings", whatif.savings),
    _section("patterns", patterns.patterns),
    _section("anomaly", anomaly_mode),
    _section("gc", gc),
    _section("recompute", recompute.recompute),
    _section("module_hooks", module_hooks.module_hooks),
    _section("grad_sync", grad_sync.gradient_sync),
    _section("data_parallel", grad_sync.data_parallel),
    _section("float64", float64.float64_ops),
    _section("graph_breaks", graph_breaks.graph_breaks),
    _section("dropout", dropout.dropout),
    _section("embeddings", embeddings.embeddings),
    _section("attention", attention.attention),
)
