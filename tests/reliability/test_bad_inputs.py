"""Every input in the bad-input corpus gets a clear answer from `torchscope analyze`, never a traceback.

Each case runs the real CLI in a subprocess (`python -m torchscope analyze PATH --format json`) and
checks the exit code, that stderr is exactly one line naming the file and the problem (or empty when the
input is fine), and, for hostile inputs, time (subprocess timeout) and peak memory.
"""

from __future__ import annotations

import io
import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from bad_inputs import CORPUS, BadInput, CliResult, run_cli, synthetic_events

MIN_DISTINCT_CASES = 30


def test_the_corpus_has_enough_distinct_cases() -> None:
    names = [case.name for case in CORPUS]
    assert len(set(names)) == len(names), "duplicate case names"
    assert len(names) >= MIN_DISTINCT_CASES
    assert sum(case.exit_code == 2 for case in CORPUS) >= 20
    assert sum(case.partial for case in CORPUS) >= 5


def _skip_reason(case: BadInput) -> str | None:
    return case.skip_reason()


@dataclass(frozen=True)
class CaseRun:
    directory: Path
    target: Path
    args: list[str]
    result: Future[CliResult]


@pytest.fixture(scope="module")
def corpus_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, CaseRun]]:
    """Builds the selected cases and runs them all, a few subprocesses at a time (they are independent)."""
    selected: list[Any] = [
        item.callspec.params["case"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_bad_input_gets_a_clear_answer"
    ]
    runs: dict[str, CaseRun] = {}
    cache_home = tmp_path_factory.mktemp("xdg-cache")
    environ = dict(os.environ)  # on this thread: the runs read it while pytest changes os.environ (run_cli)
    with ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 2)) as pool:
        for case in selected:
            if _skip_reason(case):
                continue
            directory = tmp_path_factory.mktemp(case.name) / "case"
            directory.mkdir()
            target = case.build(directory)
            args = ["analyze", str(target), "--format", "json", *(a.replace("{dir}", str(directory)) for a in case.args)]
            future = pool.submit(run_cli, *args, measure_memory=case.max_rss_mb is not None, cache_home=cache_home, environ=environ)
            runs[case.name] = CaseRun(directory, target, args, future)
        yield runs


@pytest.mark.parametrize("case", CORPUS, ids=[case.name for case in CORPUS])
def test_bad_input_gets_a_clear_answer(case: BadInput, corpus_runs: dict[str, CaseRun]) -> None:
    reason = _skip_reason(case)
    if reason:
        pytest.skip(reason)
    run = corpus_runs[case.name]
    directory, target, args = run.directory, run.target, run.args
    result = run.result.result()

    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == case.exit_code, result.stderr
    lines = result.stderr.splitlines()
    if not case.message:
        assert lines == [], result.stderr
    else:
        assert len(lines) == 1, result.stderr
        line = lines[0]
        expected_prefix = "torchscope: error: " if case.exit_code else "torchscope: warning: partial report: "
        assert line.startswith(expected_prefix), line
        assert re.search(case.message, line), f"{case.message!r} not in {line!r}"
        if case.names_file:
            assert target.name in line, line
    if case.max_rss_mb is not None:
        assert result.peak_rss_mb < case.max_rss_mb, f"peak RSS {result.peak_rss_mb:.0f} MB"
    if case.exit_code == 0 and "-o" not in args and "terminal" not in args:
        report = json.loads(result.stdout)
        assert report["run"]["partial"] is case.partial
        assert bool(report["warnings"]) is case.partial
        if case.finding:
            assert case.finding in [f["id"] for f in report["findings"]]
        if case.check:
            case.check(directory, report)


def test_warnings_also_reach_stderr_with_the_terminal_format(tmp_path: Path) -> None:
    """A partial report says so on stderr whatever the format; the terminal report repeats it."""
    case = next(c for c in CORPUS if c.name == "negative_durations")
    target = case.build(tmp_path)
    result = run_cli("analyze", str(target), "--width", "100")
    assert result.returncode == 0
    assert re.fullmatch(r"torchscope: warning: partial report: neg\.json: set 1 negative duration\(s\) to 0\n", result.stderr)
    assert "negative duration" in result.stdout


def test_a_partial_report_stays_partial_when_served_from_the_caches(tmp_path: Path) -> None:
    """The second run reads the cached tables/results; the warning must not get lost on the way."""
    target = next(c for c in CORPUS if c.name == "ts_as_string").build(tmp_path)
    first = run_cli("analyze", str(target), "--format", "json", cache_home=tmp_path / "xdg")
    second = run_cli("analyze", str(target), "--format", "json", cache_home=tmp_path / "xdg")
    assert (tmp_path / ".torchscope-cache").is_dir()
    assert first.returncode == second.returncode == 0
    assert first.stderr == second.stderr != ""
    assert json.loads(first.stdout)["warnings"] == json.loads(second.stdout)["warnings"] != []


def test_several_paths_one_missing_is_an_error(tmp_path: Path) -> None:
    """A typo among several paths stops the analysis (exit 2) instead of silently analysing less."""
    good = next(c for c in CORPUS if c.name == "no_steps").build(tmp_path)
    result = run_cli("analyze", str(good), str(tmp_path / "typo.json"))
    assert result.returncode == 2
    assert result.stderr == f"torchscope: error: {tmp_path / 'typo.json'}: no such file or directory\n"


def test_one_rank_truncated_is_skipped_with_the_process_pool_too(tmp_path: Path) -> None:
    """Errors raised in pool workers cross the process boundary intact (they used to break the pool)."""
    case = next(c for c in CORPUS if c.name == "one_rank_truncated")
    target = case.build(tmp_path)
    result = run_cli("analyze", str(target), "--format", "json", "--jobs", "3", "--no-cache")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"torchscope: warning: partial report: .*host_rank2.*\(rank skipped\)\n", result.stderr)
    assert json.loads(result.stdout)["run"]["ranks"] == [0, 1]


def test_internal_errors_are_one_line_with_exit_code_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    """The last-resort guard: a bug below the CLI is reported in one line, not a traceback."""
    import importlib

    import torchscope
    from torchscope import cli

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero\nsecond line")

    # The function behind the public `torchscope.analyze`, in the module that holds it (the CLI calls it there).
    pipeline = importlib.import_module(torchscope.analyze.__module__)
    for name in ("analyze", "analyze_run"):  # whichever the CLI calls
        monkeypatch.setattr(pipeline, name, broken, raising=False)
    target = next(c for c in CORPUS if c.name == "no_steps").build(tmp_path)
    assert cli.main(["analyze", str(target)]) == 3
    err = capsys.readouterr().err
    assert err == "torchscope: internal error: ZeroDivisionError: float division by zero second line (please report)\n"


def test_gzip_inflating_past_the_memory_limit_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A gzip bomb that looks like JSON (whitespace) is stopped at the limit, not inflated in full."""
    import gzip

    from torchscope.errors import TraceFormatError
    from torchscope.trace import read

    monkeypatch.setattr(read, "max_trace_bytes", lambda: 4 << 20)
    monkeypatch.setattr(read, "INFLATE_CHUNK_BYTES", 1 << 20)
    bomb = tmp_path / "spaces.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (32 << 20) + b"[]"))
    with pytest.raises(TraceFormatError, match=r"gzip data inflates to more than 4\.0 MiB"):
        read.read_trace_bytes(bomb)
    plain = tmp_path / "big.json"
    plain.write_bytes(b" " * (5 << 20) + b"[]")
    with pytest.raises(TraceFormatError, match=r"file is larger than 4\.0 MiB"):
        read.read_trace_bytes(plain)


def test_damaged_cache_entries_of_every_kind_are_rebuilt(tmp_path: Path) -> None:
    """Entries with the right key but inconsistent content are ignored, never trusted."""
    import numpy as np

    from torchscope.trace import cache, entry
    from torchscope.trace.load import load_trace_file

    trace = tmp_path / "t.json"
    trace.write_bytes(json.dumps({"traceEvents": synthetic_events()}).encode())
    first = load_trace_file(trace)
    key = cache.cache_key(trace)
    location = cache.store(trace, key, first)
    assert location is not None
    _, payload = entry.read_unchecked(location)
    good = dict(np.load(io.BytesIO(payload), allow_pickle=False))

    def damaged(**changes: np.ndarray) -> None:  # in an intact envelope: the checks inside must catch it
        entry.write_entry(location, key, lambda handle: np.savez(handle, **{**good, **changes}))
        assert cache.load_cached(trace, key) is None

    damaged(name=np.full(good["name"].size, 10_000, np.int32))  # string ids past the table
    damaged(name=np.full(good["name"].size, -1, np.int32))  # negative string ids
    damaged(ts_us=good["ts_us"].astype(np.int32))  # wrong dtype
    damaged(dur_us=good["dur_us"][:-1])  # ragged columns
    damaged(__meta__=np.frombuffer(b'{"key": "%s", "header": []}' % key.encode(), np.uint8))  # header not an object
    again = load_trace_file(trace)  # and the next load rebuilds a good entry
    assert len(again.events) == len(first.events)
    assert cache.load_cached(trace, key) is not None
