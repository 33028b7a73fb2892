"""Property-based fuzzing of `torchscope analyze` with mutated small real traces (../shared/traces', or the
identical copies committed under tests/data/traces).

Mutations: truncation at any offset, byte flips (in the JSON text and in the gzip stream), deletion of
event fields, and type changes of field values. Whatever the mutation, the CLI must answer with exit
code 0 (a report, with at most one warning line) or 2 (one error line naming the file), never a
traceback, and within a time bound. Examples run in-process through `torchscope.cli.main` for speed;
a few run through a real subprocess. Derandomized, so a failure reproduces on every run.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_inputs import CLI_TIMEOUT_S, SMALL_TRACES, real_trace_text, run_cli

IN_PROCESS_BOUND_S = 20.0  # one in-process example; the small traces take well under 0.1 s intact
# More examples for a longer hunt: TORCHSCOPE_FUZZ_EXAMPLES=2000 python3 -m pytest tests/reliability/test_fuzz.py
EXAMPLES = int(os.environ.get("TORCHSCOPE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("TORCHSCOPE_FUZZ_RANDOM") is None,  # reproducible unless asked otherwise
    database=None,
    # the conftest's autouse fixture only points the fall-back cache at a temporary folder
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

TRACE_NAMES = sorted(SMALL_TRACES)
FORMATS = ("json", "terminal")
EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args", "s", "bp")
ARG_KEYS = ("External id", "correlation", "stream", "device", "grid", "block", "Input Dims", "Sequence number",
            "Bytes", "Total Allocated", "name", "Collective name", "flops")


class _Texts:
    """The JSON texts and parsed documents of the small traces, loaded once."""

    def __init__(self) -> None:
        self.text: dict[str, bytes] = {}
        self.doc: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> bytes:
        if name not in self.text:
            self.text[name] = real_trace_text(name)
            self.doc[name] = json.loads(self.text[name])
        return self.text[name]

    def events(self, name: str) -> list[dict[str, Any]]:
        self[name]
        events: list[dict[str, Any]] = self.doc[name]["traceEvents"]
        return events

    def header(self, name: str) -> dict[str, Any]:
        self[name]
        return {k: v for k, v in self.doc[name].items() if k != "traceEvents"}


TEXTS = _Texts()

# Replacement values: each a wrong type, a hostile number, or an odd structure.
HOSTILE_VALUES = st.one_of(
    st.sampled_from([None, True, False, "", "NaN", "-1", "0x10", "1e400", "ProfilerStep#1", "[/red][bold", "\x1b[2J\r\n",
                     "ProfilerStep#\u00b2", [], {}, [1, 2], {"a": 1},
                     -1, 0, -(10**6), 2**63, 2**64 + 1, -(2**70), 10**30, 1e308, -1e308, 1.5, 5e-324]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(ARG_KEYS), st.one_of(st.integers(), st.text(max_size=5), st.none()), max_size=3),
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def analyze_in_process(path: Path, fmt: str = "json") -> tuple[int, str, str]:
    from torchscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["analyze", str(path), "--format", fmt, "--no-cache", "--jobs", "1"])
    assert time.perf_counter() - started < IN_PROCESS_BOUND_S
    return code, out.getvalue(), err.getvalue()


def assert_clean_answer(path: Path, code: int, stdout: str, stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert code in (0, 2), stderr
    lines = stderr.splitlines()
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("torchscope: error: "), stderr
        assert path.name in lines[0], stderr
    else:
        assert len(lines) <= 1, stderr
        if lines:  # damage makes a partial report; steps left out (evaluation) are said without the prefix
            assert lines[0].startswith("torchscope: warning: "), stderr
        if stdout.startswith("{"):  # --format json
            partial = bool(lines) and lines[0].startswith("torchscope: warning: partial report: ")
            assert json.loads(stdout)["run"]["partial"] is partial


def check(workdir: Path, name: str, data: bytes, fmt: str = "json") -> None:
    path = workdir / name
    path.write_bytes(data)
    assert_clean_answer(path, *analyze_in_process(path, fmt))


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity on purpose: Python writes them


# --- byte-level mutations ----------------------------------------------------------------------------


@FUZZ
@given(trace=st.sampled_from(TRACE_NAMES), where=st.floats(0.0, 1.0), gzipped=st.booleans())
def test_truncated_traces(workdir: Path, trace: str, where: float, gzipped: bool) -> None:
    text = TEXTS[trace]
    data = gzip.compress(text, mtime=0) if gzipped else text
    cut = data[: int(len(data) * where)]
    check(workdir, "truncated.json.gz" if gzipped else "truncated.json", cut)


@FUZZ
@given(
    trace=st.sampled_from(TRACE_NAMES),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=8),
    gzipped=st.booleans(),
)
def test_flipped_bytes(workdir: Path, trace: str, flips: list[tuple[float, int]], gzipped: bool) -> None:
    text = TEXTS[trace]
    data = bytearray(gzip.compress(text, mtime=0) if gzipped else text)
    for where, mask in flips:
        data[int(len(data) * where)] ^= mask
    check(workdir, "flipped.json.gz" if gzipped else "flipped.json", bytes(data))


# --- event-level mutations ---------------------------------------------------------------------------


def _mutated(trace: str, picks: list[tuple[float, Any]], mutate: Any) -> dict[str, Any]:
    events = list(TEXTS.events(trace))  # shallow: only mutated events are copied
    for where, how in picks:
        index = int(len(events) * where)
        events[index] = mutate(copy.deepcopy(events[index]), how)
    return {**TEXTS.header(trace), "traceEvents": events}


def _delete_field(event: dict[str, Any], field: tuple[str, str | None]) -> dict[str, Any]:
    name, arg_key = field
    if arg_key is not None and isinstance(event.get("args"), dict):
        event["args"].pop(arg_key, None)
    else:
        event.pop(name, None)
    return event


@FUZZ
@given(
    trace=st.sampled_from(TRACE_NAMES),
    picks=st.lists(
        st.tuples(
            st.floats(0.0, 1.0, exclude_max=True),
            st.tuples(st.sampled_from(EVENT_FIELDS), st.one_of(st.none(), st.sampled_from(ARG_KEYS))),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_deleted_event_fields(workdir: Path, trace: str, picks: list[tuple[float, tuple[str, str | None]]]) -> None:
    check(workdir, "deleted.json", _dumps(_mutated(trace, picks, _delete_field)))


def _change_type(event: dict[str, Any], change: tuple[str, str | None, Any]) -> dict[str, Any]:
    field, arg_key, value = change
    if arg_key is not None and isinstance(event.get("args"), dict):
        event["args"][arg_key] = value
    else:
        event[field] = value
    return event


@FUZZ
@given(
    trace=st.sampled_from(TRACE_NAMES),
    picks=st.lists(
        st.tuples(
            st.floats(0.0, 1.0, exclude_max=True),
            st.tuples(st.sampled_from(EVENT_FIELDS), st.one_of(st.none(), st.sampled_from(ARG_KEYS)), HOSTILE_VALUES),
        ),
        min_size=1,
        max_size=40,
    ),
    fmt=st.sampled_from(FORMATS),
)
def test_changed_field_types(
    workdir: Path, trace: str, picks: list[tuple[float, tuple[str, str | None, Any]]], fmt: str
) -> None:
    check(workdir, "retyped.json", _dumps(_mutated(trace, picks, _change_type)), fmt)


@FUZZ
@given(
    trace=st.sampled_from(TRACE_NAMES),
    field=st.sampled_from(("ts", "dur", "name", "args", "ph", "pid", "tid", "cat")),
    value=HOSTILE_VALUES,
    fmt=st.sampled_from(FORMATS),
)
def test_one_field_changed_in_every_event(workdir: Path, trace: str, field: str, value: Any, fmt: str) -> None:
    """The same wrong value in every event (e.g. every `ts` a string): a clear error or a report."""
    events = [{**e, field: value} for e in TEXTS.events(trace)]
    check(workdir, "all.json", _dumps({**TEXTS.header(trace), "traceEvents": events}), fmt)


@FUZZ
@given(
    trace=st.sampled_from(TRACE_NAMES),
    key=st.sampled_from(("distributedInfo", "deviceProperties", "schemaVersion", "traceEvents", "displayTimeUnit",
                         "baseTimeNanoseconds", "traceName")),
    value=HOSTILE_VALUES,
)
def test_changed_header_fields(workdir: Path, trace: str, key: str, value: Any) -> None:
    doc = {**TEXTS.header(trace), "traceEvents": TEXTS.events(trace), key: value}
    check(workdir, "header.json", _dumps(doc))


# --- a few through the real CLI process ---------------------------------------------------------------


@settings(FUZZ, max_examples=4)
@given(
    trace=st.sampled_from(TRACE_NAMES),
    where=st.floats(0.0, 1.0),
    flips=st.lists(st.tuples(st.floats(0.0, 1.0, exclude_max=True), st.integers(1, 255)), max_size=3),
)
def test_mutations_through_a_subprocess(workdir: Path, trace: str, where: float, flips: list[tuple[float, int]]) -> None:
    data = bytearray(gzip.compress(TEXTS[trace], mtime=0))
    for position, mask in flips:
        data[int(len(data) * position)] ^= mask
    path = workdir / "subprocess.json.gz"
    path.write_bytes(bytes(data[: max(int(len(data) * where), 1)]))
    started = time.perf_counter()
    result = run_cli("analyze", str(path), "--format", "json", "--no-cache")
    assert time.perf_counter() - started < CLI_TIMEOUT_S
    assert_clean_answer(path, result.returncode, result.stdout, result.stderr)
