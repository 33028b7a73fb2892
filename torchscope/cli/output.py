"""Writing a report to `-o FILE`: atomically (a full disk or a kill leaves the previous file whole), and
never over one of the inputs (a trace given to `analyze`, or a trace inside a folder given to it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from torchscope.errors import InputError
from torchscope.files import write_atomic
from torchscope.rundir.layout import is_trace_name

MAX_WIDTH = 1000  # wider, rich would lay out (and the terminal show) nothing useful; it also bounds memory


def check_output_target(output: str, inputs: Sequence[str]) -> None:
    """Refuse an output path that is one of `inputs`, or a trace file inside an input folder."""
    target = Path(output)
    if target.is_dir():
        return  # write_report says "Is a directory"
    try:
        real = Path(os.path.realpath(target))
    except (OSError, ValueError):
        return  # write_report reports what is wrong with it
    for given in inputs:
        source = Path(os.path.realpath(given))
        same = _same_file(target, Path(given))
        inside = source.is_dir() and real.is_relative_to(source) and is_trace_name(real.name) and real.exists()
        if same or inside:
            raise InputError(f"{output}: is an input of this analysis; not overwritten (choose another -o)")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def write_report(output: str, text: str) -> None:
    """Write `text` (with a final newline) to `output` atomically; InputError when it cannot be written."""
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "backslashreplace")
    target = Path(output)
    if target.is_dir():
        raise InputError(f"{output}: cannot write report (Is a directory)")
    try:
        write_atomic(target, data)
    except OSError as exc:
        raise InputError(f"{output}: cannot write report ({exc.strerror or exc})") from None
