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
    "command",
    [["run", "x.py"], ["demo"], ["analyze", "t.json"], ["diff", "a", "b"], ["memory", "s.pickle"],
     ["tune", "x.py"], ["check", "r", "--baseline", "b.json"]],
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


def test_check_fits_the_width(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    for width in (60, 120):
        assert main(["check", str(TRACE), "--baseline", str(TRACE), "--width", str(width), "--no-cache"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines and max(len(line) for line in lines) <= width


def test_tune_result_fits_the_width() -> None:
    from torchscope.render.tune_terminal import render_tune_terminal
    from torchscope.report.tune import Candidate, TuneResult
    from torchscope.report.model import Fix

    change = ["--- /home/someone/projects/a_training_script_with_a_long_path/train.py:42",
              "- loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=0, collate_fn=collate)",
              "+ loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, collate_fn=collate)"]
    candidate = Candidate(fix="num_workers=2", description="data_loading.exposed: " + "the loading runs in the "
                          "training process and the step waits for it; " * 3, fixes=[Fix(kind="dataloader_kwarg", target="num_workers", value=2)],
                          status="faster", speedup=1.8, ci_low=1.5, ci_high=2.1, predicted_saving=0.4,
                          measured_saving=0.45, change=change)
    result = TuneResult(command=["/home/someone/projects/a_training_script_with_a_long_path/train.py", "--epochs", "1"],
                        baseline_step_us=52_000.0, baseline_steps=15, noise_pct=3.0, candidates=[candidate],
                        trials=4, elapsed_s=80.0, verdict="best: num_workers=2 (1.80x)")
    wide = render_tune_terminal(result, width=200)
    assert max(len(line) for line in wide.splitlines()) > 100  # nothing wraps when there is room
    for width in (60, 80):
        text = render_tune_terminal(result, width=width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "".join(text.split()) == "".join(wide.split())  # the same text, only the line breaks differ


def test_check_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    # The gate's default ("5%") went into the help unescaped: argparse's %-formatting raised a traceback.
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["check", "--help"])
    assert exit_.value.code == 0 and "--width" in capsys.readouterr().out
