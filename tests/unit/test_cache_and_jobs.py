"""The parsed-trace cache and the process pool never change results (on real traces: ../shared's, or the
copies committed under tests/data/traces)."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec

import torchscope
from helpers.real_traces import TraceSet
from torchscope.report.model import encode_report
from torchscope.trace import cache
from torchscope.trace.load import load_trace_file

analyze = torchscope.analyze


def _copy(source: Path, tmp: Path) -> Path:
    """A copy of one trace file in a folder of its own under `tmp` (named like the source's folder)."""
    target = tmp / source.parent.name / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, target)
    return target


def _comparable(report) -> dict:  # type: ignore[no-untyped-def]
    data = msgspec.json.decode(encode_report(report))
    data["run"].pop("paths")
    return data


def test_cached_and_uncached_analysis_are_identical(real_traces: TraceSet, tmp_path: Path) -> None:
    # The largest real trace at hand: the committed traces lack hta_nccl_rank0.
    trace = _copy(real_traces.file("hta_nccl_rank0", "resnet50_num_workers_0"), tmp_path)
    fresh = analyze(trace, jobs=1, use_cache=False)
    first = analyze(trace, jobs=1, use_cache=True)  # writes the entry
    entry = trace.parent / ".torchscope-cache" / f"{trace.name}.npz"
    assert entry.is_file()
    second = analyze(trace, jobs=1, use_cache=True)  # reads it
    assert _comparable(fresh) == _comparable(first) == _comparable(second)


def test_changed_file_is_never_served_from_a_stale_entry(real_traces: TraceSet, tmp_path: Path) -> None:
    trace = _copy(real_traces.file("triton_single"), tmp_path)
    load_trace_file(trace)
    other = real_traces.file("rocm_mi250")
    shutil.copy(other, trace)  # same name, different content
    assert len(load_trace_file(trace).events) == len(load_trace_file(other, use_cache=False).events)


def test_corrupt_cache_entry_is_rebuilt(real_traces: TraceSet, tmp_path: Path) -> None:
    trace = _copy(real_traces.file("triton_single"), tmp_path)
    expected = len(load_trace_file(trace).events)
    entry = trace.parent / ".torchscope-cache" / f"{trace.name}.npz"
    entry.write_bytes(b"not an npz at all")
    assert len(load_trace_file(trace).events) == expected
    assert entry.stat().st_size > 100  # rewritten


def test_unwritable_trace_folder_uses_the_user_cache_dir(real_traces: TraceSet, tmp_path: Path) -> None:
    trace = _copy(real_traces.file("triton_single"), tmp_path)
    local, user = cache.locations(trace)
    # A file where the cache folder should be makes the location next to the trace unwritable (tests run
    # as root, so permissions alone would not).
    local.parent.write_text("not a folder")
    key = cache.cache_key(trace)
    written = cache.store(trace, key, load_trace_file(trace, use_cache=False))
    assert written == user
    assert cache.load_cached(trace, key) is not None


def test_jobs_1_and_jobs_2_give_identical_reports(real_traces: TraceSet) -> None:
    folder = real_traces.folder("hta_two_ranks_nccl")
    assert _comparable(analyze(folder, jobs=1, use_cache=False)) == _comparable(analyze(folder, jobs=2, use_cache=False))


def test_analysis_results_are_cached_and_invalidated(real_traces: TraceSet, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from torchscope.analysis.span import SpanInput
    from torchscope.pipeline import extract_cache

    trace = _copy(real_traces.file("triton_single"), tmp_path)
    first = analyze(trace, jobs=1, use_cache=True)
    entry = trace.parent / ".torchscope-cache" / f"{trace.name}.extracts.msgpack"
    assert entry.is_file()
    calls = []
    real_init = SpanInput.__init__
    monkeypatch.setattr(SpanInput, "__init__", lambda self, t: calls.append(t) or real_init(self, t))
    assert _comparable(analyze(trace, jobs=1, use_cache=True)) == _comparable(first)
    assert calls == []  # served from the extract cache
    entry.write_bytes(b"\x00garbage")
    assert _comparable(analyze(trace, jobs=1, use_cache=True)) == _comparable(first)
    assert len(calls) == 1  # damaged entry: recomputed (and rewritten)
    extract_cache._layers_digest.cache_clear()
    monkeypatch.setattr(extract_cache, "_layers_digest", lambda: "other analysis code")
    analyze(trace, jobs=1, use_cache=True)
    assert len(calls) == 2  # different analysis code: recomputed
    shutil.copy(real_traces.file("rocm_mi250"), trace)
    assert analyze(trace, jobs=1, use_cache=True).run.device_kind == "rocm"  # changed file: recomputed
    assert len(calls) == 3


def test_folders_without_write_bits_are_left_alone_even_for_root(real_traces: TraceSet, tmp_path: Path) -> None:
    trace = _copy(real_traces.file("triton_single"), tmp_path)
    trace.parent.chmod(0o555)
    try:
        analyze(trace, jobs=1, use_cache=True)
        assert not (trace.parent / ".torchscope-cache").exists()
        assert cache.load_cached(trace, cache.cache_key(trace)) is not None  # in the user cache instead
    finally:
        trace.parent.chmod(0o755)
