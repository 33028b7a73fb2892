"""Property-based tests of issue 14's classes: hostile trace headers, numbers, file names and folder shapes,
and damaged or misplaced cache entries. Whatever hypothesis builds, `torchscope analyze` answers with exit
code 0 or 2 (never 3, the internal error), one stderr line at most with no raw control character, and a
report that encodes; caches never serve a damaged or stale entry and never write through a symlink.
Examples run in-process through `torchscope.cli.main`; derandomized (the same examples on every run).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_inputs import synthetic_trace
from torchscope.cli import main
from torchscope.files import write_atomic
from torchscope.pipeline import extract_cache
from torchscope.pipeline.analyze import analyze
from torchscope.trace import cache, entry
from torchscope.trace.validate import clean_header

EXAMPLES = int(os.environ.get("TORCHSCOPE_FUZZ_EXAMPLES", "60"))
HOSTILE = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("TORCHSCOPE_FUZZ_RANDOM") is None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")

# Numbers no encoder or renderer can take as they are, and ordinary ones.
HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([2**63, 2**64, -(2**63) - 1, 2**200, -(2**90), 1e308, -1e308, 5e-324, 0, -1, 1.5]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)
HEADER_VALUES = st.recursive(
    st.one_of(HOSTILE_NUMBERS, st.none(), st.booleans(), st.text(max_size=12)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=12,
)
DEVICE_FIELDS = st.fixed_dictionaries(
    {},
    optional={key: HEADER_VALUES for key in ("name", "computeMajor", "computeMinor", "totalGlobalMem", "numSms")},
)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "schemaVersion": HEADER_VALUES,
        "deviceProperties": st.one_of(HEADER_VALUES, st.lists(DEVICE_FIELDS, max_size=2)),
        "distributedInfo": st.one_of(HEADER_VALUES, st.fixed_dictionaries({}, optional={
            "rank": HEADER_VALUES, "world_size": HEADER_VALUES, "backend": HEADER_VALUES})),
        "baseTimeNanoseconds": HEADER_VALUES,
        "other": HEADER_VALUES,
    },
)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # Python's json writes NaN/Infinity literals, as some tools do


def _analyze(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["analyze", *args])
    return code, out.getvalue(), err.getvalue()


def _assert_clear_answer(code: int, stdout: str, stderr: str, fmt: str) -> None:
    assert code in (0, 2), stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) <= 1, stderr
    assert not RAW_CONTROL.search(stderr), repr(stderr)
    if code == 0 and fmt == "json":
        json.loads(stdout)  # standard JSON: no NaN, no Infinity, no lone surrogate


@HOSTILE
@given(header=HEADERS, fmt=st.sampled_from(["json", "terminal"]))
def test_hostile_headers_never_reach_the_encoders(tmp_path_factory: pytest.TempPathFactory, header: dict[str, Any],
                                                  fmt: str) -> None:
    folder = tmp_path_factory.mktemp("hdr")
    trace = folder / "trace.json"
    trace.write_bytes(_dumps(synthetic_trace(**header)))
    for _ in range(2):  # parsed, then served from the caches
        _assert_clear_answer(*_analyze(str(trace), "--format", fmt), fmt)


@HOSTILE
@given(header=HEADER_VALUES)
def test_a_cleaned_header_encodes_everywhere(header: Any) -> None:
    cleaned = clean_header({"h": header})
    msgspec.msgpack.encode(cleaned)
    text = json.dumps(cleaned, allow_nan=False)
    assert json.loads(text) == cleaned


@HOSTILE
@given(times=st.lists(st.tuples(HOSTILE_NUMBERS, HOSTILE_NUMBERS), min_size=1, max_size=6),
       fmt=st.sampled_from(["json", "terminal"]))
def test_hostile_event_times_give_finite_reports(tmp_path_factory: pytest.TempPathFactory,
                                                 times: list[tuple[float, float]], fmt: str) -> None:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100}]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": dur} for ts, dur in times]
    folder = tmp_path_factory.mktemp("num")
    trace = folder / "trace.json"
    trace.write_bytes(_dumps({"traceEvents": events}))
    _assert_clear_answer(*_analyze(str(trace), "--format", fmt, "--no-cache"), fmt)


FILE_NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=20),
    st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b),
)


@HOSTILE
@given(name=FILE_NAMES, fmt=st.sampled_from(["json", "terminal"]))
def test_hostile_file_names_are_escaped_in_every_message(tmp_path_factory: pytest.TempPathFactory, name: str | bytes,
                                                         fmt: str) -> None:
    stem = os.fsdecode(name) if isinstance(name, bytes) else name
    if stem in (".", ".."):
        return
    folder = tmp_path_factory.mktemp("name")
    good, empty = folder / f"{stem}.json", folder / "sub" / f"{stem}.json"
    try:
        good.write_bytes(_dumps(synthetic_trace()))
        empty.parent.mkdir()
        empty.write_bytes(b"")
    except OSError:  # a name too long for this file system
        return
    code, stdout, stderr = _analyze(str(good), "--format", fmt)
    _assert_clear_answer(code, stdout, stderr, fmt)
    assert code == 0
    if fmt == "terminal":
        assert not RAW_CONTROL.search(stdout.replace("\n", "")), repr(stdout)
    code, stdout, stderr = _analyze(str(empty), "--format", fmt)
    _assert_clear_answer(code, stdout, stderr, fmt)
    assert code == 2 and "empty file" in stderr


# A folder shape: entries of one folder, each a trace, a FIFO, a link (to a trace, a folder above, /dev/zero,
# nothing) or a sub-folder of the same.
ENTRY_KINDS = st.sampled_from(["trace", "trace", "fifo", "link_trace", "link_up", "link_dev_zero", "dangling",
                               "dir_named_json", "empty"])
SHAPES = st.recursive(st.lists(ENTRY_KINDS, min_size=1, max_size=5),
                      lambda children: st.lists(st.one_of(ENTRY_KINDS, children), min_size=1, max_size=4), max_leaves=10)


def _build(folder: Path, shape: Any, traces: list[Path]) -> None:
    for index, kind in enumerate(shape):
        path = folder / f"e{index}.pt.trace.json"
        if isinstance(kind, list):
            sub = folder / f"d{index}"
            sub.mkdir()
            _build(sub, kind, traces)
        elif kind == "trace":
            path.write_bytes(_dumps(synthetic_trace()))
            traces.append(path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "link_trace" and traces:
            path.symlink_to(traces[0])  # the same trace again: counted once
        elif kind == "link_up":
            (folder / f"up{index}").symlink_to("..")
        elif kind == "link_dev_zero":
            path.symlink_to("/dev/zero")
        elif kind == "dangling":
            path.symlink_to(folder / "nothing-here")
        elif kind == "dir_named_json":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")


@HOSTILE
@given(shape=SHAPES)
def test_any_folder_shape_ends_with_each_trace_counted_once(tmp_path_factory: pytest.TempPathFactory, shape: Any) -> None:
    folder = tmp_path_factory.mktemp("shape") / "run"
    folder.mkdir()
    traces: list[Path] = []
    _build(folder, shape, traces)
    started = time.monotonic()
    code, stdout, stderr = _analyze(str(folder), "--format", "json", "--jobs", "1")
    assert time.monotonic() - started < 60  # no FIFO or device read forever
    _assert_clear_answer(code, stdout, stderr, "json")
    if code == 0:
        files = [f for rank in json.loads(stdout)["ranks"] for f in rank["files"]]
        assert len(files) == len(set(files))
        reachable = {os.path.realpath(t) for t in traces if t.parent == folder or _within_depth(t, folder)}
        assert len(files) <= len(reachable)


def _within_depth(path: Path, top: Path) -> bool:
    return len(path.relative_to(top).parts) <= 4


def test_the_same_trace_given_twice_or_through_a_link_counts_once(tmp_path: Path) -> None:
    trace = tmp_path / "a.json"
    trace.write_bytes(_dumps(synthetic_trace()))
    (tmp_path / "b.json").symlink_to(trace)
    report = analyze([trace, trace, tmp_path / "b.json", tmp_path], jobs=1)
    assert sum(len(rank.files) for rank in report.ranks) == 1


@pytest.mark.parametrize("error, reason", [(PermissionError(errno.EACCES, "Permission denied"), "Permission denied"),
                                           (OSError(errno.EIO, "Input/output error"), "Input/output error")])
def test_a_sub_folder_that_cannot_be_listed_is_one_warning_and_the_rest_is_analysed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, reason: str) -> None:
    """Walk errors are warnings, also when running as root (root lists a chmod 000 folder, so the
    corpus case `unreadable_sub_folder` skips there): the listing of one sub-folder fails, as it would for
    another user's folder or a failing disk."""
    (tmp_path / "rank0.pt.trace.json").write_bytes(_dumps(synthetic_trace()))
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "rank1.pt.trace.json").write_bytes(_dumps(synthetic_trace()))
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(path) == locked:
            raise type(error)(error.errno, error.strerror, str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, stdout, stderr = _analyze(str(tmp_path), "--format", "json", "--no-cache")
    assert code == 0, stderr
    assert stderr.splitlines() == [f"torchscope: warning: partial report: {locked}: cannot list directory ({reason}); "
                                   "skipped"], stderr
    report = json.loads(stdout)
    assert report["run"]["partial"] is True
    assert [file for rank in report["ranks"] for file in rank["files"]] == [str(tmp_path / "rank0.pt.trace.json")]


# --- caches ----------------------------------------------------------------------------------------


def _cached_trace(folder: Path) -> Path:
    trace = folder / "trace.json"
    trace.write_bytes(_dumps(synthetic_trace()))
    analyze(trace, jobs=1)
    return trace


@HOSTILE
@given(position=st.floats(min_value=0, max_value=1, exclude_max=True), bit=st.integers(0, 7),
       which=st.sampled_from(["extracts", "tables"]))
def test_a_flipped_bit_in_any_cache_entry_is_never_served(tmp_path_factory: pytest.TempPathFactory, position: float,
                                                          bit: int, which: str) -> None:
    trace = _cached_trace(tmp_path_factory.mktemp("flip"))
    suffix = ".extracts.msgpack" if which == "extracts" else ".npz"
    location = trace.parent / ".torchscope-cache" / f"{trace.name}{suffix}"
    data = bytearray(location.read_bytes())
    data[int(position * len(data))] ^= 1 << bit
    location.write_bytes(bytes(data))
    key = cache.cache_key(trace)
    if which == "extracts":
        assert extract_cache.load(trace, key) == {}
    else:
        assert cache.load_cached(trace, key) is None


def test_a_file_rewritten_in_place_with_its_mtime_restored_is_not_served(tmp_path: Path) -> None:
    trace = _cached_trace(tmp_path)
    before = os.stat(trace)
    key = cache.cache_key(trace)
    text = trace.read_bytes()
    time.sleep(0.01)
    trace.write_bytes(text.replace(b"gemm_kernel", b"gemm_kernez"))  # same size
    os.utime(trace, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(trace).st_mtime_ns == before.st_mtime_ns and os.stat(trace).st_size == before.st_size
    assert cache.cache_key(trace) != key  # the ctime moved
    assert "gemm_kernez" in json.dumps(msgspec.to_builtins(analyze(trace, jobs=1)))


def test_an_entry_for_another_key_is_not_read_past_its_header(tmp_path: Path) -> None:
    location = tmp_path / "entry"
    entry.write_entry(location, "a" * 64, lambda handle: handle.write(b"x" * 100))
    with open(location, "r+b") as handle:  # now claims gigabytes: a decompression bomb would, too
        handle.truncate(4 << 30)
    started = time.monotonic()
    assert entry.open_entry(location, "b" * 64, 8 << 30) is None
    assert time.monotonic() - started < 1.0
    with pytest.raises(OSError):  # larger than the bound: refused before any byte is hashed
        entry.open_entry(location, "a" * 64, 1 << 20)


def test_cache_entries_are_never_written_through_a_symlinked_cache_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / ".torchscope-cache").symlink_to(elsewhere)
    trace = traces / "trace.json"
    trace.write_bytes(_dumps(synthetic_trace()))
    analyze(trace, jobs=1)
    assert list(elsewhere.iterdir()) == []
    assert cache.locations(trace)[0] not in cache.writable_locations(trace)


def test_temporary_files_of_a_killed_write_are_removed_on_the_next_run(tmp_path: Path) -> None:
    trace = _cached_trace(tmp_path)
    folder = trace.parent / ".torchscope-cache"
    dead = folder / ".trace.json.npz.999999999.0123abcd.tmp"  # a pid that does not exist
    dead.write_bytes(b"x" * 1000)
    old = folder / f".trace.json.npz.{os.getpid()}.89abcdef.tmp"  # ours, but old: from before a crash
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    trace.write_bytes(trace.read_bytes() + b" ")  # changed: the entries are written again
    analyze(trace, jobs=1)
    assert not dead.exists() and not old.exists()


def test_cache_entries_are_read_only_from_regular_files(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_bytes(_dumps(synthetic_trace()))
    folder = tmp_path / ".torchscope-cache"
    folder.mkdir()
    os.mkfifo(folder / "trace.json.npz")
    os.mkfifo(folder / "trace.json.extracts.msgpack")
    started = time.monotonic()
    assert analyze(trace, jobs=1).steps
    assert time.monotonic() - started < 30


# --- output ---------------------------------------------------------------------------------------


def test_a_failed_write_of_o_keeps_the_previous_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace.json"
    trace.write_bytes(_dumps(synthetic_trace()))
    out = tmp_path / "report.json"
    out.write_text("previous report\n")

    def full_disk(handle: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    import torchscope.files as files

    real = files.os.replace
    monkeypatch.setattr(files.os, "replace", lambda *a: full_disk(None))
    code, _, stderr = _analyze(str(trace), "--format", "json", "-o", str(out))
    monkeypatch.setattr(files.os, "replace", real)
    assert code == 2 and "No space left on device" in stderr
    assert out.read_text() == "previous report\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_o_never_overwrites_an_input_trace(tmp_path: Path) -> None:
    trace = tmp_path / "a.pt.trace.json"
    text = _dumps(synthetic_trace())
    trace.write_bytes(text)
    for target in (trace, tmp_path / "link.json"):
        if target != trace:
            target.symlink_to(trace)
        code, _, stderr = _analyze(str(tmp_path), "--format", "json", "-o", str(target))
        assert code == 2 and "is an input of this analysis" in stderr
        assert trace.read_bytes() == text


def test_write_atomic_leaves_no_temporary_file_on_failure(tmp_path: Path) -> None:
    def fails(handle: Any) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(tmp_path / "x", fails)
    assert list(tmp_path.iterdir()) == []


def test_non_finite_numbers_never_reach_the_renderers(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_bytes(_dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1.7e308},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1e308, "dur": 1e308},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": math.inf}]}))
    report = analyze(trace, jobs=1, use_cache=False)
    json.dumps(msgspec.to_builtins(report), allow_nan=False)
