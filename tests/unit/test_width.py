"""`--width` on every command that prints a report, and the terminal's width by default (issue 13)."""

from __future__ import annotations

import io
import os
import pty
from pathlib import Path

import pytest

from torchscope.cli import build_parser, main
from torchscope.cli.width import DEFAULT_WIDTH, report_width, terminal_width
from torchscope.errors import UsageError

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "resnet50_num_workers_0"


def test_explicit_width_is_checked() -> None:
    assert report_width(60, io.StringIO()) == 60
    with pytest.raises(UsageError, match="at least 20"):
        report_width(5, None)
    with pytest.raises(UsageError, match="at most 1000"):
        report_width(5000, None)


def test_a_file_or_a_pipe_gets_the_default_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert report_width(None, None) == DEFAULT_WIDTH
    assert terminal_width(io.StringIO()) == DEFAULT_WIDTH


def test_columns_then_the_terminal_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "72")
    assert report_width(None, io.StringIO()) == 72
    monkeypatch.delenv("COLUMNS")
    leader, follower = pty.openpty()
    try:
        os.set_blocking(leader, False)
        import fcntl
        import struct
        import termios

        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 83, 0, 0))
        with os.fdopen(os.dup(follower), "w") as tty:
            assert report_width(None, tty) == 83
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize(
    "command", [["run", "x.py"], ["demo"], ["analyze", "t.json"], ["diff", "a", "b"], ["memory", "s.pickle"]]
)
def test_every_reporting_command_takes_width(command: list[str]) -> None:
    args = build_parser().parse_args([command[0], "--width", "64", *command[1:]])
    assert args.width == 64


def test_analyze_fits_the_width(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    for width in (60, 80):
        assert main(["analyze", str(TRACE), "--width", str(width), "--no-cache"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines and max(len(line) for line in lines) <= width
        assert max(len(line) for line in lines) > width - 10  # the tables use the room they get


def test_a_wider_terminal_shows_longer_names(tmp_path: Path) -> None:
    from helpers.trace_builder import TraceBuilder
    from torchscope.pipeline.analyze import analyze
    from torchscope.render.terminal import render_terminal

    name = "aten::" + "a_rather_long_custom_operator_name_" * 3  # 111 characters
    b = TraceBuilder()
    for i, t0 in enumerate((0.0, 100.0, 200.0)):
        b.step(i + 1, t0, 100)
        b.op(name, t0 + 10, 50)
    report = analyze(str(b.write(tmp_path / "long.pt.trace.json")), use_cache=False)
    assert name not in render_terminal(report, width=100)  # cut to the 100-column layout
    assert name in render_terminal(report, width=200)
