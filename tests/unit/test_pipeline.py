"""The analysis registry, the extract cache, run-level merges, metrics and the version-1 reader, on real
committed traces (tests/data/traces) and on synthetic ones."""

from __future__ import annotations

import gzip
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

import torchscope
from helpers.real_traces import COMMITTED_TRACES
from torchscope.analysis import registry
from torchscope.analysis.reduce import merge_sections, weighted_median
from torchscope.analysis.registry import Analysis, Part, SpanKey
from torchscope.analysis.span import SpanInput
from torchscope.pipeline import extract_cache
from torchscope.trace import entry as cache_entry
from torchscope.report.measurements import Copies, DataLoader, Optimizer, Synchronization
from torchscope.report.metrics import metrics_of
from torchscope.report.model import SCHEMA_VERSION, decode_report, encode_report
from torchscope.workers import start_method

TRITON = COMMITTED_TRACES / "triton_single" / "triton_example.json.gz"
TWO_RANKS = COMMITTED_TRACES / "hta_two_ranks_nccl"


def _copy(source: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(source, folder / source.name))


# --- a toy analysis: this block and its registration are all it takes -------------------------------

class KernelCount(msgspec.Struct):
    kernels: int


def count_kernels(span: SpanInput) -> KernelCount:
    return KernelCount(int((span.events.kind == 4).sum()))  # Kind.KERNEL


def total_kernels(parts: list[Part[KernelCount]]) -> dict[str, Any]:
    return {"extra.kernel_count": {"total": sum(p.value.kernels for p in parts), "spans": len(parts)}}


TOY = Analysis(name="kernel_count", extract=count_kernels, extract_type=KernelCount, reduce=total_kernels)


@pytest.fixture
def toy() -> Any:
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)


def test_a_registered_analysis_runs_per_span_and_lands_in_extra(toy: Any) -> None:
    from torchscope.trace.kinds import Kind

    assert int(Kind.KERNEL) == 4
    report = torchscope.analyze(TWO_RANKS, jobs=1, use_cache=False)
    expected = sum(k.calls for k in report.kernels)
    assert report.extra["kernel_count"] == {"total": expected, "spans": 2}
    assert expected > 0
    assert json.loads(encode_report(report))["extra"]["kernel_count"]["total"] == expected


def test_a_registered_analysis_crosses_the_process_pool(toy: Any) -> None:
    serial = torchscope.analyze(TWO_RANKS, jobs=1, use_cache=False)
    pooled = torchscope.analyze(TWO_RANKS, jobs=2, use_cache=False)
    assert pooled.extra == serial.extra
    assert [s.duration_us for s in pooled.steps] == [s.duration_us for s in serial.steps]


def test_an_analysis_filling_an_undeclared_field_is_refused() -> None:
    rogue = Analysis(name="rogue", extract=count_kernels, extract_type=KernelCount,
                     reduce=lambda parts: {"steps": []})
    registry.register(rogue)
    try:
        with pytest.raises(ValueError, match="does not declare"):
            torchscope.analyze(TRITON, jobs=1, use_cache=False)
    finally:
        registry.unregister("rogue")


# --- the extract cache -------------------------------------------------------------------------------

def test_extracts_are_cached_per_analysis_and_recomputed_when_one_changes(tmp_path: Path, toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _copy(TRITON, tmp_path / "t")
    calls: list[str] = []
    real_init = SpanInput.__init__

    def counting(self: SpanInput, trace_file: Any) -> None:
        calls.append(trace_file.path)
        real_init(self, trace_file)

    monkeypatch.setattr(SpanInput, "__init__", counting)
    first = torchscope.analyze(trace, jobs=1, use_cache=True)
    assert len(calls) == 1
    entry = trace.parent / ".torchscope-cache" / f"{trace.name}.extracts.msgpack"
    assert entry.is_file()
    assert torchscope.analyze(trace, jobs=1, use_cache=True).steps == first.steps
    assert len(calls) == 1  # every extract served from the cache: the tables were not even opened

    # A changed analysis (another fingerprint) recomputes itself only.
    changed = Analysis(name=TOY.name, extract=count_kernels, extract_type=KernelCount, reduce=total_kernels)
    real_fingerprint = extract_cache.fingerprint
    monkeypatch.setattr(extract_cache, "fingerprint",
                        lambda a, key: real_fingerprint(a, key) + ("changed" if a.name == TOY.name else ""))
    registry.register(changed)
    assert torchscope.analyze(trace, jobs=1, use_cache=True).extra["kernel_count"] == first.extra["kernel_count"]
    assert len(calls) == 2  # the tables were read once more, for the one stale extract
    stored = msgspec.msgpack.decode(cache_entry.read_unchecked(entry)[1])["extracts"]
    assert stored[TOY.name]["fingerprint"].endswith("changed")
    assert not stored["steps"]["fingerprint"].endswith("changed")


def test_a_damaged_or_foreign_extract_cache_entry_is_recomputed(tmp_path: Path) -> None:
    trace = _copy(TRITON, tmp_path / "t")
    first = torchscope.analyze(trace, jobs=1, use_cache=True)
    entry = trace.parent / ".torchscope-cache" / f"{trace.name}.extracts.msgpack"
    entry.write_bytes(b"\x00garbage")
    assert torchscope.analyze(trace, jobs=1, use_cache=True).steps == first.steps
    # An entry whose extracts have the right fingerprints but the wrong shape is not served either.
    torchscope.analyze(trace, jobs=1, use_cache=True)  # rewrites the entry
    key, payload = cache_entry.read_unchecked(entry)
    data = msgspec.msgpack.decode(payload)
    data["extracts"]["steps"]["data"] = msgspec.msgpack.encode({"rows": "not rows"})
    cache_entry.write_entry(entry, key, lambda handle: handle.write(msgspec.msgpack.encode(data)))  # a valid envelope
    assert torchscope.analyze(trace, jobs=1, use_cache=True).steps == first.steps


def test_a_changed_trace_is_never_served_from_the_cache(tmp_path: Path) -> None:
    trace = _copy(TRITON, tmp_path / "t")
    assert torchscope.analyze(trace, jobs=1, use_cache=True).run.device_kind == "cuda"
    rocm = COMMITTED_TRACES / "rocm_mi250" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    shutil.copy(rocm, trace)
    assert torchscope.analyze(trace, jobs=1, use_cache=True).run.device_kind == "rocm"


def test_table_cache_key_covers_the_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchscope.trace import cache

    trace = _copy(TRITON, tmp_path / "t")
    key = cache.cache_key(trace)
    cache.schema_fingerprint.cache_clear()
    monkeypatch.setitem(cache.schema.ARG_FIELDS, "new_column", ("new key", int, -1))
    try:
        assert cache.cache_key(trace) != key  # a new declared field invalidates every cached table
    finally:
        cache.schema_fingerprint.cache_clear()


# --- merges ------------------------------------------------------------------------------------------

def _key(steps: int) -> SpanKey:
    return SpanKey(rank=0, worker="w", file="f", span=0, steps=steps, step_us=steps * 100.0, has_device=True)


def test_sections_merge_by_their_declared_rules() -> None:
    parts = [
        Part(key=_key(1), value=Copies(htod_per_step=2.0, pageable_bandwidth_gbps=1.0)),
        Part(key=_key(3), value=Copies(htod_per_step=6.0, pageable_bandwidth_gbps=9.0)),
        Part(key=_key(5), value=None),  # not applicable to that span: left out
    ]
    merged = merge_sections(parts, Copies)
    assert merged.htod_per_step == pytest.approx((2 * 1 + 6 * 3) / 4)  # step-weighted mean
    assert merged.pageable_bandwidth_gbps == 9.0  # weighted median: 3 of 4 steps say 9
    counts = merge_sections([Part(key=_key(1), value=DataLoader(single_process_fetches=3)),
                             Part(key=_key(9), value=DataLoader(single_process_fetches=4))], DataLoader)
    assert counts.single_process_fetches == 7  # counts add up
    by_name = merge_sections([Part(key=_key(1), value=Synchronization(by_op={"a": 4.0})),
                              Part(key=_key(1), value=Synchronization(by_op={"a": 2.0, "b": 10.0}))], Synchronization)
    assert by_name.by_op == {"b": 5.0, "a": 3.0}  # absent counts as zero; largest first
    names = merge_sections([Part(key=_key(1), value=Optimizer(optimizers=["SGD"], implementation="for_loop")),
                            Part(key=_key(1), value=Optimizer(optimizers=["Adam", "SGD"], implementation="for_loop")),
                            Part(key=_key(1), value=Optimizer(optimizers=[], implementation="fused"))], Optimizer)
    assert names.optimizers == ["SGD", "Adam"] and names.implementation == "for_loop"


def test_weighted_median() -> None:
    assert weighted_median([1.0, 3.0], [1.0, 1.0]) == 2.0  # between two equal halves: their mean
    assert weighted_median([1.0, 3.0, 10.0], [1.0, 1.0, 5.0]) == 10.0
    assert weighted_median([5.0], [0.0]) == 5.0


def test_every_section_field_declares_a_merge() -> None:
    from torchscope.analysis.reduce import merge_rules
    from torchscope.report.measurements import SECTION_TYPES

    for section in SECTION_TYPES.values():
        assert set(merge_rules(section)) == {f.name for f in msgspec.structs.fields(section)}


# --- metrics and the JSON contract ---------------------------------------------------------------------

def test_metrics_have_units_directions_and_values_from_the_report() -> None:
    report = torchscope.analyze(COMMITTED_TRACES / "resnet50_num_workers_0", jobs=1, use_cache=False)
    metrics = {m.name: m for m in report.metrics}
    mean = sum(s.duration_us for s in report.steps) / len(report.steps)
    assert metrics["step_time.mean_us"].value == pytest.approx(mean)
    assert metrics["step_time.mean_us"].unit == "us" and metrics["step_time.mean_us"].better == "lower"
    assert metrics["throughput.steps_per_s"].value == pytest.approx(1e6 / mean)
    assert metrics["device.utilization"].better == "higher"
    assert metrics["breakdown.data_loading_us"].value == pytest.approx(report.breakdown["data_loading"].us)
    assert metrics["idle.us_per_step"].value == pytest.approx(report.measurements.idle.idle_us_per_step)
    assert all(m.unit and m.better in ("lower", "higher", "none") for m in report.metrics)
    assert len(metrics) == len(report.metrics)  # names are unique
    assert metrics_of(report) == report.metrics


def test_a_trace_without_steps_reports_no_step_time_metrics() -> None:
    report = torchscope.analyze(COMMITTED_TRACES / "alexnet_sync", jobs=1, use_cache=False)
    assert report.run.step_source == "whole_trace"
    assert not any(m.name.startswith(("step_time.", "throughput.")) for m in report.metrics)


def test_version_2_round_trips_and_version_1_still_loads() -> None:
    report = torchscope.analyze(TRITON, jobs=1, use_cache=False)
    assert report.schema_version == SCHEMA_VERSION == 2
    assert decode_report(encode_report(report)) == report
    # A report written by version 1 (the golden of resnet50_num_workers_0 before it was rewritten; paths trimmed).
    golden = Path(__file__).resolve().parents[1] / "data" / "reports" / "v1_resnet50_num_workers_0.json.gz"
    v1 = json.loads(gzip.decompress(golden.read_bytes()))
    v1.update(schema_version=1, torchscope_version="0.1.0")
    old = decode_report(json.dumps(v1).encode())
    assert old.schema_version == 2
    assert old.measurements.sync.syncs_per_step == v1["signals"]["sync"]["syncs_per_step"]
    assert old.measurements.idle.idle_us_per_step == v1["signals"]["idle_us_per_step"]
    assert old.measurements.outside_steps.culprits_us_per_step == v1["signals"]["outside_steps"]
    assert [f.id for f in old.findings] == [f["id"] for f in v1["findings"]]
    assert all(f.fixes == [] for f in old.findings)


# --- pools -------------------------------------------------------------------------------------------

def test_pools_fork_only_from_a_single_threaded_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchscope.workers as workers

    monkeypatch.setattr(workers.threading, "active_count", lambda: 1)
    assert start_method() == "fork"
    monkeypatch.undo()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert start_method() == "forkserver"  # a forked child could inherit another thread's held lock
        report = torchscope.analyze(TWO_RANKS, jobs=2, use_cache=False)  # a pool started beside a thread
        assert report.run.ranks == [0, 1]
    finally:
        stop.set()
        thread.join()


# --- a sidecar analysis: per-rank detail crosses the pool, and stays out of the Report ------------------

class KernelLane(msgspec.Struct):
    """Start and duration of every kernel of a span, decimated to at most 50 points (a timeline lane)."""

    start_us: list[float]
    dur_us: list[float]


def kernel_lane(span: SpanInput) -> KernelLane:
    kernels = (span.events.kind == 4).nonzero()[0]
    step = max(len(kernels) // 50, 1)
    chosen = kernels[::step]
    return KernelLane(span.events.ts_us[chosen].tolist(), span.events.dur_us[chosen].tolist())


def lanes_by_rank(parts: list[Part[KernelLane]]) -> dict[str, Any]:
    return {"kernel_lanes": {str(p.key.rank): p.value for p in parts}}


LANES = Analysis(name="kernel_lanes", extract=kernel_lane, extract_type=KernelLane, reduce=lanes_by_rank, sidecar=True)


def test_a_sidecar_analysis_is_kept_beside_the_report_and_written_under_sidecars(tmp_path: Path) -> None:
    from torchscope.pipeline.analyze import analyze_run, write_sidecars

    registry.register(LANES)
    try:
        run = analyze_run(TWO_RANKS, jobs=2, use_cache=False)
    finally:
        registry.unregister(LANES.name)
    lanes = run.sidecars["kernel_lanes"]
    assert set(lanes) == {"0", "1"}
    assert 0 < len(lanes["0"].start_us) <= 60 and len(lanes["0"].start_us) == len(lanes["0"].dur_us)
    assert "kernel_lanes" not in run.report.extra and b"kernel_lanes" not in encode_report(run.report)
    written = write_sidecars(tmp_path, {"kernel_lanes": lanes})  # not the built-in sidecars (the timeline)
    assert written == [tmp_path / "sidecars" / "kernel_lanes.msgpack"]
    back = msgspec.msgpack.decode(written[0].read_bytes(), type=dict[str, KernelLane])
    assert back == lanes


def test_cache_keys_are_the_same_in_every_process() -> None:
    """A key that changed between processes (an object's address in it) would make every cache miss."""
    import subprocess
    import sys

    from torchscope.trace import cache

    code = f"from pathlib import Path; from torchscope.trace import cache; print(cache.cache_key(Path({str(TRITON)!r})))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == cache.cache_key(TRITON)


@pytest.mark.parametrize("name", ["alexnet_sync", "hta_cpu_only_gloo", "resnet50_num_workers_0", "rocm_mi250"])
def test_every_builtin_extract_of_a_real_trace_can_be_cached(name: str) -> None:
    """A value msgpack cannot hold (a numpy scalar, a set) is silently recomputed on every run: each
    built-in analysis's extract of real CPU and GPU traces must encode."""
    from torchscope.analysis.catalogue import all_analyses
    from torchscope.trace.load import load_trace_file

    trace = next(p for p in sorted((COMMITTED_TRACES / name).iterdir()) if ".json" in p.name)
    span = SpanInput(load_trace_file(trace, use_cache=False))
    unencodable = []
    for analysis in all_analyses(None):
        try:
            msgspec.msgpack.encode(analysis.extract(span))
        except (OverflowError, TypeError, ValueError) as exc:
            unencodable.append(f"{analysis.name}: {exc}")
    assert not unencodable
