"""Parsing one file in byte ranges on several threads or processes (trace/ranges.py): the same tables
as one sequential parse, and a sequential parse whenever the ranges do not join up exactly. Every test
that splits runs twice: on threads (the compiled scanner) and on processes (msgspec)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.real_traces import TraceSet
from test_stream import _assert_same, _tricky_document
from torchscope.trace import fastscan, ranges
from torchscope.trace import parse as parse_module
from torchscope.trace.parse import parse_trace


@pytest.fixture(params=["threads", "processes"])
def small_ranges(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Split even small files, into ranges of a few KB (real use splits files of tens of MB)."""
    if request.param == "processes":
        monkeypatch.setenv(fastscan.DISABLE_ENV, "1")
    elif not fastscan.available():
        pytest.skip("the compiled scanner is not built: ranges only run on processes")
    assert ranges.on_threads() == (request.param == "threads")
    for name in ("PARALLEL_MIN_BYTES", "THREAD_PARALLEL_MIN_BYTES"):
        monkeypatch.setattr(ranges, name, 1)
    _min_range_bytes(monkeypatch, 2048)
    return str(request.param)


def _min_range_bytes(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    for name in ("MIN_RANGE_BYTES", "THREAD_MIN_RANGE_BYTES"):
        monkeypatch.setattr(ranges, name, size)


def _write(tmp_path: Path, doc: Any, indent: int | None = None) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc, indent=indent))
    return path


@pytest.mark.usefixtures("small_ranges")
@pytest.mark.parametrize("indent", [None, 2])
def test_ranges_give_the_same_tables(tmp_path: Path, indent: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _tricky_document()
    # Boundary look-alikes at depth > 1 and events larger than a range; no look-alike strings, which
    # make a range whose start lands in one fall back (tested below).
    events = [e for e in doc["traceEvents"] if "}, {" not in e["name"] and "Call stack" not in e["args"]]
    for event in events:
        if "nested" in event["args"]:
            event["args"]["nested"] = [{"a": 1}, {"b": [{"c": 2}, {"d": 3}]}]
    doc["traceEvents"] = events * 5  # about 60 ranges of 2 KB: 16 at 4 jobs (RANGES_PER_JOB)
    path = _write(tmp_path, doc, indent)
    sequential = parse_trace(path)
    parts: list[ranges.RangePart] = []
    real = ranges.parse_ranges

    def counted(*args: Any) -> Any:
        for part in real(*args):
            parts.append(part)
            yield part

    monkeypatch.setattr(ranges, "parse_ranges", counted)
    _assert_same(parse_trace(path, jobs=4), sequential)
    assert len(parts) == 4 * ranges.RANGES_PER_JOB  # it really ran in ranges
    assert sum(len(p.columns["ts_us"]) > 0 for p in parts) >= 10  # empty only where a 20 KB event spans one


@pytest.mark.usefixtures("small_ranges")
def test_ranges_keep_int_and_string_pids_apart(tmp_path: Path) -> None:
    """Real traces mix `"tid": 1` and `"tid": "1"`; one process gives them two ids, so must ranges."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1 if i % 2 else "1", "tid": i % 3, "ts": i,
               "dur": 1, "args": {"Input Dims": [[i % 2]]}} for i in range(3000)]
    path = _write(tmp_path, events)
    sequential, ranged = parse_trace(path), parse_trace(path, jobs=2)
    _assert_same(ranged, sequential)
    assert len(set(ranged.events.pid.tolist())) == 2


@pytest.mark.usefixtures("small_ranges")
def test_bare_array_in_ranges(tmp_path: Path) -> None:
    path = _write(tmp_path, _tricky_document()["traceEvents"] * 3)
    _assert_same(parse_trace(path, jobs=2), parse_trace(path))


@pytest.mark.usefixtures("small_ranges")
def test_a_range_starting_inside_a_look_alike_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _tricky_document()
    path = _write(tmp_path, doc)
    text = path.read_bytes()
    inside = text.index(b"weird}, {") + 2  # the next `}, {` is inside the string
    real_plan = ranges.plan_ranges
    monkeypatch.setattr(ranges, "plan_ranges", lambda size, start, jobs: [real_plan(size, start, jobs)[0], inside])
    fallbacks: list[str] = []
    real_stream = parse_module._parse_stream
    monkeypatch.setattr(parse_module, "_parse_stream", lambda *a, **k: fallbacks.append("seq") or real_stream(*a, **k))
    trace = parse_trace(path, jobs=2)
    assert fallbacks == ["seq"]
    _assert_same(trace, parse_module._parse_whole(text, "<bytes>"))
    assert len(trace.events) == 201


@pytest.mark.usefixtures("small_ranges")
def test_plain_real_traces_in_ranges(real_traces: TraceSet) -> None:
    plain = [p for p in real_traces.files() if p.suffix == ".json"]
    assert plain, f"no uncompressed trace in {real_traces.root}"
    for path in plain:
        _assert_same(parse_trace(path, jobs=2), parse_trace(path))


def test_gzip_and_small_files_are_not_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fastscan.DISABLE_ENV, "1")  # the process thresholds
    path = _write(tmp_path, _tricky_document())
    assert not parse_module._splittable(path)  # below PARALLEL_MIN_BYTES
    size = 10 << 30
    count = (size - 100) // ranges.RANGE_BYTES  # about 32 MB each
    assert ranges.plan_ranges(size, 100, 2) == [100 + i * ((size - 100) // count) for i in range(count)]
    assert len(ranges.plan_ranges(100 << 20, 100, 2)) == 8  # at least 4 per process
    assert len(ranges.plan_ranges(60 << 20, 100, 2)) == 4  # but none under 12 MB
    assert ranges.plan_ranges(20 << 20, 100, 2) == [100]


@pytest.mark.usefixtures("small_ranges")
def test_reports_are_identical_with_ranges(real_traces: TraceSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole analysis of a real GPU trace, parsed in ranges (--jobs 2) or in one process."""
    import gzip

    import msgspec

    from torchscope import analyze
    from torchscope.report.model import encode_report

    _min_range_bytes(monkeypatch, 1 << 20)
    source = real_traces.file("resnet50_num_workers_0")
    plain = tmp_path / source.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    assert len(ranges.plan_ranges(plain.stat().st_size, 0, 2)) == 8

    def report(jobs: int) -> Any:
        return msgspec.json.decode(encode_report(analyze(plain, jobs=jobs, use_cache=False)))

    sequential = report(1)

    def no_fallback(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the ranges did not join up: parsed sequentially")

    monkeypatch.setattr(parse_module, "_parse_stream", no_fallback)
    assert report(2) == sequential


@pytest.mark.usefixtures("small_ranges")
def test_progress_follows_the_bytes_parsed(real_traces: TraceSet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar's callback: bytes of text, rising as batches and ranges are parsed, ending at
    the total; for rank sets in the pool, rank by rank."""
    import gzip

    from torchscope import analyze

    _min_range_bytes(monkeypatch, 1 << 20)
    source = real_traces.file("resnet50_num_workers_0")
    plain = tmp_path / source.name.removesuffix(".gz")
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    cases = [(plain, 2), (source, 1), (real_traces.folder("hta_two_ranks_nccl"), 2)]
    for path, jobs in cases:
        calls: list[tuple[int, int]] = []
        analyze(path, jobs=jobs, use_cache=False, progress=lambda done, total: calls.append((done, total)))
        done = [d for d, _ in calls]
        totals = {t for _, t in calls}
        assert len(totals) == 1 and done == sorted(done) and done[0] == 0, (path, calls)
        assert done[-1] == totals.pop() > 0, (path, calls)
        assert len(set(done)) >= 3, (path, calls)  # intermediate steps, not only start and end


def _sigint_disposition() -> Any:
    import signal

    return signal.getsignal(signal.SIGINT)


def test_pool_workers_leave_ctrl_c_to_the_main_process() -> None:
    """Ctrl-C reaches the whole process group; workers ignore it so only the main process reports it
    (one line, exit 130) instead of a KeyboardInterrupt traceback per worker."""
    import signal

    from torchscope.workers import process_pool

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever pytest inherited
    try:
        with process_pool(2) as pool:
            assert pool.submit(_sigint_disposition).result() == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the main process keeps its own
    finally:
        signal.signal(signal.SIGINT, before)


def test_ranges_run_on_threads_with_the_scanner_and_on_processes_without(
    small_ranges: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scanner releases the GIL, so its ranges share the process (no start-up, no pickling);
    msgspec holds the GIL, so its ranges need processes."""
    path = _write(tmp_path, _tricky_document(), indent=2)
    pools: list[str] = []
    real = ranges._pool

    def recorded(workers: int) -> Any:
        pool = real(workers)
        pools.append(type(pool).__name__)
        return pool

    monkeypatch.setattr(ranges, "_pool", recorded)
    _assert_same(parse_trace(path, jobs=2), parse_trace(path))
    expected = "ThreadPoolExecutor" if small_ranges == "threads" else "ProcessPoolExecutor"
    assert pools == [expected]


def test_thread_and_process_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads split files from 64 MB into ranges of at least 8 MB; processes from 48 MB, 12 MB."""
    if fastscan.available():
        assert ranges.on_threads() and ranges.min_parallel_bytes() == 64 << 20
        assert len(ranges.plan_ranges(64 << 20, 0, 2)) == 8  # 4 per thread, 8 MB each
        assert len(ranges.plan_ranges(40 << 20, 0, 2)) == 5  # none under 8 MB
    monkeypatch.setenv(fastscan.DISABLE_ENV, "1")
    assert not ranges.on_threads() and ranges.min_parallel_bytes() == 48 << 20
    assert len(ranges.plan_ranges(64 << 20, 0, 2)) == 5  # none under 12 MB
