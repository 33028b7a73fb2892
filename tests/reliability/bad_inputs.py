"""A corpus of bad inputs for `torchscope analyze`, generated on demand (nothing big is committed).

Each `BadInput` writes one damaged, hostile or unusual input under a fresh directory and states what
torchscope must do with it: the exit code (2 = a clear error; 0 = a result, with a one-line warning on
stderr when the report is partial) and a regular expression for that one stderr line. Real traces come
from ../shared/traces (beside the repository) when present, else from the identical copies committed
under tests/data/traces (tests/helpers/real_traces.py).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from helpers.real_traces import trace_set  # tests/ is on sys.path (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
# Small real traces (a few KB to 85 KB of JSON), one per hardware flavour: folder and file, whole copies
# of ../shared's in tests/data/traces.
SMALL_TRACES = {
    "cpu_gloo": ("hta_cpu_only_gloo", "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"),
    "triton": ("triton_single", "triton_example.json.gz"),
    "rocm": ("rocm_mi250", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
    "tb_unit": ("tb_unit", "gpu_metrics_input.json"),
}
CLI_TIMEOUT_S = 60


def real_trace_path(name: str) -> Path:
    folder, file = SMALL_TRACES[name]
    return trace_set().folder(folder) / file


def real_trace_text(name: str) -> bytes:
    """The JSON text of one small real trace (gunzipped)."""
    data = real_trace_path(name).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


# --- a small valid synthetic trace, the base of the type-change cases --------------------------------


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 0, "dur": 10}
    base.update(fields)
    return base


def synthetic_events(steps: int = 3, with_markers: bool = True) -> list[dict[str, Any]]:
    """`steps` training steps of 1 ms: a ProfilerStep marker, a matmul, a launch and its kernel."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
    ]
    for i in range(steps):
        t0 = 1_000_000 + i * 1000
        if with_markers:
            events.append(event(cat="user_annotation", name=f"ProfilerStep#{i}", ts=t0, dur=1000))
        events.append(event(ts=t0 + 100, dur=300, args={"External id": 10 + i, "Sequence number": i}))
        events.append(
            event(cat="cuda_runtime", name="cudaLaunchKernel", ts=t0 + 150, dur=20,
                  args={"External id": 10 + i, "correlation": 100 + i})
        )
        events.append(
            event(cat="kernel", name="gemm_kernel", pid=0, tid=7, ts=t0 + 200, dur=400,
                  args={"External id": 10 + i, "correlation": 100 + i, "stream": 7, "device": 0,
                        "grid": [1, 2, 1], "block": [128, 1, 1]})
        )
    return events


def synthetic_trace(events: list[dict[str, Any]] | None = None, **header: Any) -> dict[str, Any]:
    return {"schemaVersion": 1, **header, "traceEvents": synthetic_events() if events is None else events}


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def with_bad_event(bad: dict[str, Any]) -> bytes:
    """The synthetic trace plus one malformed event."""
    return dumps(synthetic_trace(synthetic_events() + [bad]))


def garbage(size: int, seed: int = 5) -> bytes:
    """Deterministic binary noise (contains NUL bytes)."""
    return random.Random(seed).randbytes(size)


# --- the corpus ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadInput:
    name: str
    build: Callable[[Path], Path]  # writes the input under the given empty directory; returns what to analyse
    exit_code: int  # 2: a clear error; 0: a report
    message: str  # regex for the one stderr line; "" = stderr stays empty
    needs_real_traces: bool = False  # built from a real trace (../shared's, or the committed copy)
    names_file: bool = True  # the stderr line names the input file (its base name)
    finding: str | None = None  # a finding id the report must contain
    args: tuple[str, ...] = ()  # extra CLI arguments ({dir} is replaced by the case directory)
    max_rss_mb: int | None = None  # peak memory bound of the torchscope process
    skip_reason: Callable[[], str | None] = lambda: None
    check: Callable[[Path, dict[str, Any]], None] | None = None  # extra assertions on (dir, report)

    @property
    def partial(self) -> bool:
        return self.exit_code == 0 and bool(self.message)


def _file(name: str, content: bytes | Callable[[], bytes]) -> Callable[[Path], Path]:
    def build(directory: Path) -> Path:
        target = directory / name
        target.write_bytes(content() if callable(content) else content)
        return target

    return build


def _truncated_real(fraction: float) -> Callable[[], bytes]:
    """The tb_unit trace cut at `fraction` of its JSON text (1.0: only its final closing brace is lost)."""

    def content() -> bytes:
        text = real_trace_text("tb_unit").rstrip()
        return text[: min(int(len(text) * fraction), len(text) - 1)]

    return content


def _flip_gzip_byte() -> bytes:
    data = bytearray(real_trace_path("rocm").read_bytes())
    middle = len(data) // 2  # inside the deflate stream (not the header, whose mtime may change freely)
    data[middle] ^= 0xFF
    data[middle + 1] ^= 0x55
    return bytes(data)


def _gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of zero bytes, gzipped (about 200 KB), built without holding the zeros in memory."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(deflate.compress(zeros) for _ in range(mib)) + deflate.flush()


def _two_gzip_members() -> bytes:
    text = dumps(synthetic_trace())
    return gzip.compress(text[:100]) + gzip.compress(text[100:])


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _deep_args() -> bytes:
    doc = dumps(synthetic_trace(synthetic_events() + [event(args={"deep": "@"})]))
    return doc.replace(b'"@"', _deep(100_000))


def _copy_real(name: str, target_name: str | None = None) -> Callable[[Path], Path]:
    def build(directory: Path) -> Path:
        source = real_trace_path(name)
        shutil.copy(source, directory / (target_name or source.name))
        return directory

    return build


def _corrupt_cache(directory: Path) -> Path:
    trace = directory / "trace.json"
    trace.write_bytes(real_trace_text("tb_unit"))
    cache_dir = directory / ".torchscope-cache"
    cache_dir.mkdir()
    (cache_dir / "trace.json.npz").write_bytes(b"PK\x03\x04" + garbage(3000))
    return trace


def _corrupt_analysis_cache(directory: Path) -> Path:
    trace = directory / "trace.json"
    trace.write_bytes(dumps(synthetic_trace()))
    cache_dir = directory / ".torchscope-cache"
    cache_dir.mkdir()
    (cache_dir / "trace.json.analysis.msgpack").write_bytes(garbage(2000))
    (cache_dir / "trace.json.npz").mkdir()  # a directory where an entry should be
    return trace


def _check_cache_rebuilt(directory: Path, report: dict[str, Any]) -> None:
    from torchscope.trace import cache

    trace = directory / "trace.json"
    assert cache.load_cached(trace, cache.cache_key(trace)) is not None, "the damaged cache entry was not rebuilt"


def _fifo(directory: Path) -> Path:
    os.mkfifo(directory / "fifo.json")
    return directory / "fifo.json"


def _fifo_in_folder(directory: Path) -> Path:
    (directory / "a.pt.trace.json").write_bytes(dumps(synthetic_trace()))
    os.mkfifo(directory / "f.pt.trace.json")
    return directory


def _dev_zero_link(directory: Path) -> Path:
    (directory / "zero.json").symlink_to("/dev/zero")
    return directory / "zero.json"


def _symlink_loop(directory: Path) -> Path:
    (directory / "a.pt.trace.json").write_bytes(dumps(synthetic_trace()))
    (directory / "sub").mkdir()
    (directory / "sub" / "up").symlink_to("..")  # a loop back to the top
    (directory / "sub" / "same.pt.trace.json").symlink_to("../a.pt.trace.json")  # the same file again
    return directory


def _files_analysed(expected: int) -> Callable[[Path, dict[str, Any]], None]:
    def check(directory: Path, report: dict[str, Any]) -> None:
        assert sum(len(rank["files"]) for rank in report["ranks"]) == expected, report["ranks"]

    return check


def _non_utf8_name(directory: Path) -> Path:
    folder = directory / "traces"
    folder.mkdir()
    (folder / os.fsdecode(b"r\xffank.json")).write_bytes(dumps(synthetic_trace()))
    return folder


def _control_name(directory: Path) -> Path:
    path = directory / "bad\x1b[31m\x07.json"
    path.write_bytes(b"")
    return path


def _flipped_extract_entry(directory: Path) -> Path:
    """A valid extract entry with one bit flipped in its payload: detected by the checksum, recomputed."""
    from torchscope.pipeline.analyze import analyze

    trace = directory / "trace.json"
    trace.write_bytes(dumps(synthetic_trace()))
    analyze(trace, jobs=1)
    entry = directory / ".torchscope-cache" / "trace.json.extracts.msgpack"
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0x04
    entry.write_bytes(bytes(data))
    return trace


def _fifo_manifest(directory: Path) -> Path:
    (directory / "host_1.1700000000000.pt.trace.json").write_bytes(dumps(synthetic_trace()))
    os.mkfifo(directory / "run.json")  # read without the guarded opener, it would block for ever
    return directory


def _with_frame(frame: Callable[[Path], str], make: Callable[[Path], None] = lambda d: None) -> Callable[[Path], Path]:
    """A trace whose steps run in the Python frame `frame(directory)` (a `python_function` event around
    each matmul): the call-site and user-code analyses look up the source file it names."""

    def build(directory: Path) -> Path:
        make(directory)
        events = synthetic_events()
        for e in list(events):
            if e.get("name") == "aten::mm":
                events.append(event(cat="python_function", name=frame(directory), ts=e["ts"] - 50, dur=e["dur"] + 100))
        target = directory / "frames.pt.trace.json"
        target.write_bytes(dumps(synthetic_trace(events)))
        return target

    return build


def _source_fifo(directory: Path) -> None:
    os.mkfifo(directory / "src.py")  # opened without the guarded opener, it would block for ever


_CLIMB = "../" * 40  # more than any folder depth: from the standard library up to /


def _with_manifest(manifest: bytes) -> Callable[[Path], Path]:
    def build(directory: Path) -> Path:
        (directory / "host_1.1700000000000.pt.trace.json").write_bytes(dumps(synthetic_trace()))
        (directory / "run.json").write_bytes(manifest)
        return directory

    return build


def _unreadable_directory(directory: Path) -> Path:
    target = directory / "locked"
    target.mkdir()
    (target / "trace.json").write_bytes(dumps(synthetic_trace()))
    target.chmod(0)
    return target


def _unreadable_sub_folder(directory: Path) -> Path:
    (directory / "rank0.pt.trace.json").write_bytes(dumps(synthetic_trace()))
    _unreadable_directory(directory)  # locked/trace.json below, in a folder no one but root may list
    return directory


def _root_reason() -> str | None:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "running as root: permission bits do not stop root from listing a chmod 000 directory"
    return None


def _directory_named_json(directory: Path) -> Path:
    target = directory / "x.json"
    target.mkdir()
    return target


def _two_ranks_one_truncated(directory: Path) -> Path:
    for rank in (0, 1):
        events = synthetic_events()
        (directory / f"host_rank{rank}.1700000000000.pt.trace.json").write_bytes(
            dumps(synthetic_trace(events, distributedInfo={"rank": rank, "world_size": 3}))
        )
    whole = dumps(synthetic_trace(distributedInfo={"rank": 2, "world_size": 3}))
    (directory / "host_rank2.1700000000000.pt.trace.json").write_bytes(whole[: len(whole) // 2])
    return directory


def _repeated_events() -> bytes:
    one = json.dumps(event(ts=1_000_500, dur=1, args={"External id": 1})).encode()
    body = b",".join([one] * 300_000)
    head = dumps(synthetic_events())[:-1]
    return b'{"traceEvents":' + head + b"," + body + b"]}"


def _steps_count(expected: int) -> Callable[[Path, dict[str, Any]], None]:
    def check(directory: Path, report: dict[str, Any]) -> None:
        assert len(report["steps"]) == expected

    return check


def _severity(report: dict[str, Any], finding_id: str, severity: str) -> None:
    assert [f["severity"] for f in report["findings"] if f["id"] == finding_id] == [severity]


def _ranks(expected: list[int]) -> Callable[[Path, dict[str, Any]], None]:
    def check(directory: Path, report: dict[str, Any]) -> None:
        assert report["run"]["ranks"] == expected

    return check


ERROR, OK = 2, 0
TRUNCATED = r"truncated JSON \(the file ends in the middle of the data\)"
DROPPED = r"partial report: .*dropped 1 malformed event\(s\) of 14"

CORPUS: tuple[BadInput, ...] = (
    # paths and files
    BadInput("missing_path", lambda d: d / "nope.json", ERROR, r"no such file or directory"),
    BadInput("empty_directory", lambda d: d, ERROR, r"no trace files \(\*\.json, \*\.json\.gz\) found"),
    BadInput("unreadable_directory", _unreadable_directory, ERROR, r"cannot list directory \(Permission denied\)",
             skip_reason=_root_reason),
    BadInput("unreadable_sub_folder", _unreadable_sub_folder, OK, r"locked: cannot list directory \(Permission denied\); "
             r"skipped$", names_file=False, skip_reason=_root_reason, check=_files_analysed(1)),
    BadInput("directory_named_x_json", _directory_named_json, ERROR, r"x\.json: no trace files"),
    BadInput("empty_file", _file("empty.json", b""), ERROR, r"empty file"),
    BadInput("whitespace_only", _file("blank.json", b" \n\t\r\n  "), ERROR, r"empty file"),
    BadInput("non_json_text", _file("notes.json", b"This is not a trace.\n"), ERROR, r"malformed JSON"),
    BadInput("binary_garbage", _file("noise.json", garbage(4096)), ERROR, r"not JSON text \(binary data\)"),
    # truncation of a real trace at several offsets
    BadInput("truncated_at_1_byte_of_object", _file("cut.json", b"{"), ERROR, TRUNCATED),
    BadInput("truncated_real_10pct", _file("cut10.json", _truncated_real(0.10)), ERROR, TRUNCATED, needs_real_traces=True),
    BadInput("truncated_real_50pct", _file("cut50.json", _truncated_real(0.50)), ERROR, TRUNCATED, needs_real_traces=True),
    BadInput("truncated_real_last_byte", _file("cut99.json", _truncated_real(1.0)), ERROR, TRUNCATED,
             needs_real_traces=True),
    # gzip damage
    BadInput("gzip_flipped_bytes", _file("flip.json.gz", _flip_gzip_byte), ERROR, r"damaged gzip data",
             needs_real_traces=True),
    BadInput("gzip_truncated_stream",
             _file("cut.json.gz", lambda: real_trace_path("rocm").read_bytes()[:3000]), ERROR,
             r"damaged gzip data \(truncated: the stream ends early\)", needs_real_traces=True),
    BadInput("gzip_trailing_garbage", _file("tail.json.gz", lambda: gzip.compress(dumps(synthetic_trace())) + b"junk"),
             ERROR, r"damaged gzip data \(unexpected bytes after the end of the stream\)"),
    BadInput("gzip_of_non_json", _file("text.json.gz", gzip.compress(b"hello, not json\n" * 100)), ERROR,
             r"gzip content is not JSON \(it starts with b'hello, not json"),
    BadInput("gzip_bomb_of_zeros", _file("bomb.json.gz", lambda: _gzip_bomb(200)), ERROR, r"gzip content is not JSON",
             max_rss_mb=150),
    BadInput("gzip_zero_padding", _file("padded.json.gz", lambda: gzip.compress(dumps(synthetic_trace())) + bytes(512)),
             OK, ""),
    BadInput("gzip_two_members", _file("two.json.gz", _two_gzip_members), OK, ""),
    # valid JSON that is not a trace
    BadInput("json_scalar", _file("n.json", b"42"), ERROR, r"the top level is a JSON number, not an object"),
    BadInput("json_string", _file("s.json", b'"traceEvents"'), ERROR, r"the top level is a JSON string"),
    BadInput("json_null", _file("null.json", b"null"), ERROR, r"the top level is a JSON null"),
    BadInput("array_of_numbers", _file("nums.json", b"[1, 2, 3]"), ERROR, r"no usable events: all 3 event\(s\) are malformed"),
    BadInput("object_without_traceEvents", _file("obj.json", b'{"schemaVersion": 1, "deviceProperties": []}'), ERROR,
             r"not a Kineto trace: no 'traceEvents' array"),
    BadInput("traceEvents_not_an_array", _file("evobj.json", b'{"traceEvents": {"ph": "X"}}'), ERROR,
             r"'traceEvents' is not an array"),
    BadInput("traceEvents_a_string", _file("evstr.json", b'{"traceEvents": "[]"}'), ERROR, r"'traceEvents' is not an array"),
    BadInput("traceEvents_empty", _file("none.json", b'{"traceEvents": []}'), ERROR, r"trace has no events"),
    BadInput("perfetto_foreign_json", _file("systrace.json", b'{"displayTimeUnit": "ms", "systemTraceEvents": "# tracer"}'),
             ERROR, r"not a Kineto trace: no 'traceEvents' array"),
    BadInput("only_metadata_events", _file("meta.json", dumps(synthetic_trace(synthetic_events()[:1]))), ERROR,
             r"not a Kineto trace: no duration or instant events"),
    # events with missing fields or wrong types
    BadInput("events_lacking_ph", _file("noph.json", dumps({"traceEvents": [{"name": "a", "ts": 1, "dur": 2}] * 3})), ERROR,
             r"no duration or instant events"),
    BadInput("events_lacking_ts", _file("nots.json", dumps({"traceEvents": [event(ts=None), {"ph": "X", "name": "b", "dur": 3}]})),
             ERROR, r"no usable events: no event has a valid timestamp"),
    BadInput("all_events_malformed", _file("allbad.json", dumps({"traceEvents": [event(ts="soon"), event(dur=[1])]})), ERROR,
             r"no usable events: all 2 event\(s\) are malformed"),
    BadInput("ts_as_string", _file("ts.json", with_bad_event(event(ts="yesterday"))), OK, DROPPED),
    BadInput("dur_as_list", _file("dur.json", with_bad_event(event(dur=[1, 2]))), OK, DROPPED),
    BadInput("pid_as_object", _file("pid.json", with_bad_event(event(pid={"host": 1}))), OK, DROPPED),
    BadInput("name_as_number", _file("name.json", with_bad_event(event(name=12345))), OK, DROPPED),
    BadInput("args_as_string", _file("args.json", with_bad_event(event(args="External id=3"))), OK, ""),
    BadInput("kernel_args_wrong_types", _file("kargs.json", with_bad_event(
        event(cat="kernel", name="k", ts=1_000_250, args={"stream": "seven", "grid": "big", "correlation": [1]}))), OK, ""),
    BadInput("events_array_with_junk", _file("junk.json", dumps({"traceEvents": [1, "x", None, [], *synthetic_events()]})), OK,
             r"dropped 4 malformed event\(s\) of 17"),
    # numbers
    BadInput("nan_literal", _file("nan.json", lambda: with_bad_event(event(dur="@")).replace(b'"@"', b"NaN")), OK,
             r"read 1 non-standard NaN/Infinity value\(s\) as missing"),
    BadInput("infinity_literals", _file("inf.json", lambda: with_bad_event(event(ts="@", args={"flops": "@"})).replace(
        b'"@"', b"-Infinity")), OK, r"read 2 non-standard NaN/Infinity value\(s\) as missing \(and 1 more in the report\)"),
    BadInput("negative_durations", _file("neg.json", with_bad_event(event(ts=1_000_100, dur=-250))), OK,
             r"set 1 negative duration\(s\) to 0"),
    BadInput("number_out_of_range_1e400", _file("e400.json", lambda: with_bad_event(event(dur="@")).replace(b'"@"', b"1e400")),
             OK, DROPPED),
    BadInput("integers_beyond_int64", _file("big.json", with_bad_event(
        event(ts=1_000_100, id=2**70, args={"External id": 2**70, "Sequence number": -(2**80)}))), OK, ""),
    BadInput("huge_timestamps", _file("hugets.json", with_bad_event(event(ts=1e300, dur=1e300))), OK,
             r"ignored 1 event\(s\) without a valid timestamp"),
    BadInput("times_that_overflow_when_added", _file("sum.json", with_bad_event(event(ts=1e17, dur=1.7e308))), OK,
             r"set 1 infinite or implausible duration\(s\) \(over 1e\+15 us\) to 0"),
    BadInput("step_marker_with_overflowing_duration", _file("stepinf.json", dumps(synthetic_trace([
        event(cat="user_annotation", name="ProfilerStep#1", ts=0, dur=1.7e308), event(ts=5, dur=1e308)]))), OK,
        r"set 2 infinite or implausible duration", args=("--format", "terminal")),
    BadInput("step_number_overflow", _file("stepnum.json", dumps(synthetic_trace([
        event(cat="user_annotation", name="ProfilerStep#" + "9" * 30, ts=0, dur=100),
        event(cat="user_annotation", name="ProfilerStep#\u00b2", ts=100, dur=100),
        event(ts=10, dur=20)]))), OK, ""),
    BadInput("markup_and_control_characters_in_names", _file("markup.json", lambda: dumps(synthetic_trace([
        {**e, "name": "[/red][bold]\x1b[31m\r\n" + e["name"]} for e in synthetic_events()]))), OK, "",
        args=("--format", "terminal")),
    # structure: nesting, sizes, repetition, duplicates, order
    BadInput("deep_nesting_in_args", _file("deep.json", _deep_args), ERROR, r"JSON nested too deeply", max_rss_mb=300),
    BadInput("deep_nesting_top_level", _file("deeptop.json", _deep(100_000)), ERROR, r"JSON nested too deeply", max_rss_mb=300),
    BadInput("huge_string", _file("longname.json", lambda: with_bad_event(event(name="A" * (8 << 20)))), OK, "",
             max_rss_mb=700),
    BadInput("repeated_identical_events", _file("laughs.json", _repeated_events), OK, "", max_rss_mb=700),
    BadInput("duplicate_keys", _file("dup.json", lambda: b'{"traceEvents": [], "traceEvents": ' + dumps(synthetic_events())
             + b', "schemaVersion": "x", "schemaVersion": 1}'), OK, "", check=_steps_count(3)),
    BadInput("out_of_order_events", _file("shuffled.json", dumps(synthetic_trace(synthetic_events()[::-1]))), OK, "",
             check=_steps_count(3)),
    BadInput("no_steps", _file("nosteps.json", dumps(synthetic_trace(synthetic_events(with_markers=False)))), OK, "",
             finding="trace_quality.no_steps", check=lambda d, r: _severity(r, "trace_quality.no_steps", "warning")),
    # encodings
    BadInput("invalid_utf8", _file("utf8.json", lambda: with_bad_event(event(name="@")).replace(b'"@"', b'"aten::\xff\xfe"')),
             OK, DROPPED),
    BadInput("lone_surrogate_escape", _file("surrogate.json", lambda: with_bad_event(event(name="@")).replace(
        b'"@"', b'"\\ud800"')), ERROR, r"malformed JSON"),
    BadInput("utf8_bom", _file("bom.json", lambda: b"\xef\xbb\xbf" + dumps(synthetic_trace())), OK, "", check=_steps_count(3)),
    BadInput("utf16_with_bom", _file("utf16.json", lambda: json.dumps(synthetic_trace()).encode("utf-16")), OK, "",
             check=_steps_count(3)),
    # run directories: caches, manifests, ranks
    BadInput("corrupted_cache_entry", _corrupt_cache, OK, "", needs_real_traces=True, check=_check_cache_rebuilt),
    BadInput("corrupted_analysis_cache_entry", _corrupt_analysis_cache, OK, "", check=_steps_count(3)),
    BadInput("garbage_manifest", _with_manifest(b"\x00garbage{{{"), OK, ""),
    BadInput("manifest_with_wrong_types", _with_manifest(dumps(
        {"world_size": "x", "status": 5, "activities": "cuda", "schedule": [1], "command": 7,
         "environment": "cpu_count=4"})),
        OK, ""),
    BadInput("manifest_is_a_fifo", _fifo_manifest, OK, ""),
    # source files named by the trace's Python frames (issue 14): read through the same guarded opener
    BadInput("frame_source_is_a_fifo", _with_frame(lambda d: f"{d}/src.py(3): step", _source_fifo), OK, ""),
    BadInput("frame_stdlib_path_climbs_to_a_fifo",
             _with_frame(lambda d: f"json/{_CLIMB}{str(d).lstrip('/')}/src.py(3): step", _source_fifo), OK, ""),
    BadInput("frame_source_is_dev_zero", _with_frame(lambda d: "/dev/zero(3): step"), OK, "", max_rss_mb=300),
    BadInput("frame_stdlib_path_climbs_to_dev_zero", _with_frame(lambda d: f"json/{_CLIMB}dev/zero(3): step"), OK, "",
             max_rss_mb=300),
    BadInput("manifest_not_an_object", _with_manifest(b"[1, 2, 3]"), OK, ""),
    BadInput("one_rank_truncated", _two_ranks_one_truncated, OK, r"host_rank2\.1700000000000\.pt\.trace\.json: "
             r"truncated JSON .* \(rank skipped\)", check=_ranks([0, 1])),
    # header numbers (issue 14): validated at the loader, so no cache encoder or rule sees them
    BadInput("header_integers_beyond_64_bits", _file("bighdr.json", dumps(synthetic_trace(
        schemaVersion=2**70, distributedInfo={"rank": 2**70, "world_size": -(2**90)}, extra=[2**64, {"x": 2**200}]))),
        OK, ""),
    BadInput("non_numeric_compute_major", _file("cm.json", dumps(synthetic_trace(
        deviceProperties=[{"name": "gpu", "computeMajor": "abc", "computeMinor": [1], "totalGlobalMem": "lots"}]))),
        OK, ""),
    BadInput("non_finite_header_numbers", _file("nanhdr.json", lambda: dumps(synthetic_trace(
        deviceProperties=[{"name": "gpu", "computeMajor": "@", "totalGlobalMem": "@"}])).replace(b'"@"', b"1e400")), OK,
        ""),
    # paths and folders (issue 14): one guarded opener, de-duplication, walk problems as warnings
    BadInput("fifo_named_like_a_trace", _fifo, ERROR, r"fifo\.json: a FIFO, not a trace file or folder"),
    BadInput("fifo_among_traces", _fifo_in_folder, OK, r"f\.pt\.trace\.json: a FIFO, not a trace file; skipped",
             names_file=False),
    BadInput("symlink_to_dev_zero", _dev_zero_link, ERROR, r"zero\.json: a character device, not a trace file"),
    BadInput("symlink_loop_counts_a_trace_once", _symlink_loop, OK, "", names_file=False, check=_files_analysed(1)),
    BadInput("non_utf8_byte_in_a_path", _non_utf8_name, OK, "", names_file=False),
    BadInput("control_characters_in_a_path", _control_name, ERROR, r"bad\\x1b\[31m\\x07\.json: empty file",
             names_file=False),
    BadInput("stale_extract_entry_bit_flipped", _flipped_extract_entry, OK, "", check=_steps_count(3)),
    # output
    BadInput("output_to_missing_directory", _copy_real("triton"), ERROR, r"missing/report\.json: cannot write report "
             r"\(No such file or directory\)", needs_real_traces=True, names_file=False,
             args=("-o", "{dir}/missing/report.json")),
    BadInput("terminal_width_zero", _copy_real("triton"), ERROR, r"^torchscope: error: --width must be at least 20$",
             needs_real_traces=True, names_file=False, args=("--format", "terminal", "--width", "0")),
    BadInput("output_onto_the_input_trace", _file("in.json", dumps(synthetic_trace())), ERROR,
             r"in\.json: is an input of this analysis; not overwritten", args=("-o", "{dir}/in.json"),
             check=None),
    BadInput("terminal_width_huge", _copy_real("triton"), ERROR, r"^torchscope: error: --width must be at most 1000$",
             needs_real_traces=True, names_file=False, args=("--format", "terminal", "--width", "1000000000")),
    BadInput("output_is_a_directory", _copy_real("triton"), ERROR, r"cannot write report \(Is a directory\)",
             needs_real_traces=True, names_file=False, args=("-o", "{dir}")),
)


# --- running the CLI -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float


_MEASURE = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, timeout={timeout})
sys.stdout.buffer.write(proc.stdout)
sys.stderr.buffer.write(proc.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(proc.returncode)
"""


def run_cli(
    *args: str, measure_memory: bool = False, cache_home: Path | None = None, environ: Mapping[str, str] | None = None
) -> CliResult:
    """`python -m torchscope <args>` in a subprocess; with `measure_memory`, also its peak RSS.

    The memory is measured by a tiny parent process whose only child is torchscope, so that
    RUSAGE_CHILDREN is torchscope's own peak. `cache_home` becomes XDG_CACHE_HOME (the fall-back cache).
    `environ`: the environment to start from (default: this process's). From a worker thread, pass a copy
    taken on the main thread: pytest sets and deletes variables there (PYTEST_CURRENT_TEST, monkeypatched
    ones) while the thread runs, and reading `os.environ` then can raise KeyError mid-iteration."""
    base = dict(os.environ if environ is None else environ)
    env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))}
    if cache_home is not None:
        env["XDG_CACHE_HOME"] = str(cache_home)
    command = [sys.executable, "-m", "torchscope", *args]
    if measure_memory:
        command = [sys.executable, "-c", _MEASURE.format(timeout=CLI_TIMEOUT_S), *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S + 10, cwd=REPO, env=env,
                          errors="replace")
    stderr, peak = proc.stderr, 0.0
    if measure_memory:
        stderr, _, last = stderr.rstrip("\n").rpartition("\n")
        stderr = stderr + "\n" if stderr else ""
        peak = int(last) / 1024  # ru_maxrss is in KiB on Linux
    return CliResult(proc.returncode, proc.stdout, stderr, peak)
