"""files.write_atomic: all or nothing, usual permissions, nothing left behind on failure."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

import pytest

from torchscope.files import write_atomic


def test_writes_bytes_or_a_writer_with_the_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_atomic(target, b"first")
    assert target.read_bytes() == b"first"
    write_atomic(target, lambda handle: handle.write(b"second"), fsync=True)
    assert target.read_bytes() == b"second"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_bytes(b"previous")

    def failing(handle: BinaryIO) -> None:
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, failing)
    assert target.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["run.json"]
