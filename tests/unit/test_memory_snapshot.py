"""`torchscope memory SNAPSHOT.pickle` on snapshots written as `torch.cuda.memory._dump_snapshot()`
writes them (the documented format, built here without a GPU), and hostile pickles refused."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchscope.cli import main

MIB = 1024 * 1024


def _frames(line: int) -> list[dict[str, Any]]:
    """Innermost first, as the allocator records them: C++ and torch frames, then the user's."""
    return [
        {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
        {"filename": "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": "/home/me/train.py", "line": line, "name": "train_step"},
    ]


def _block(size: int, state: str, line: int = 10, address: int = 0) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size - 512 if state != "inactive" else 0, "state": state,
            "frames": _frames(line) if state != "inactive" else []}  # fmt: skip


def snapshot() -> dict[str, Any]:
    """cuda:0: one 20 MiB segment (8 MiB from train.py:10 and 2 MiB from :20 allocated, 6 + 4 MiB free),
    one 2 MiB small segment fully free; a history that allocates 4 MiB (:30), frees it, reaches its peak
    with 16 MiB (:40), frees that, with two cudaMallocs and one OOM."""
    large = {"device": 0, "address": 1 << 32, "total_size": 20 * MIB, "allocated_size": 10 * MIB, "active_size": 10 * MIB,
             "requested_size": 10 * MIB - 1024, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": [],
             "blocks": [_block(8 * MIB, "active_allocated", 10), _block(6 * MIB, "inactive"), _block(2 * MIB, "active_allocated", 20),
                        _block(4 * MIB, "inactive")]}  # fmt: skip
    small = {"device": 0, "address": 1 << 33, "total_size": 2 * MIB, "allocated_size": 0, "active_size": 0, "stream": 0,
             "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
             "blocks": [_block(2 * MIB, "inactive")]}  # fmt: skip
    trace = [
        {"action": "segment_alloc", "addr": 1 << 40, "size": 32 * MIB, "stream": 0, "frames": [], "time_us": 1},
        {"action": "alloc", "addr": 100, "size": 4 * MIB, "stream": 0, "frames": _frames(30), "time_us": 2},
        {"action": "free_requested", "addr": 100, "size": 4 * MIB, "stream": 0, "frames": [], "time_us": 3},
        {"action": "free_completed", "addr": 100, "size": 4 * MIB, "stream": 0, "frames": [], "time_us": 3},
        {"action": "alloc", "addr": 200, "size": 16 * MIB, "stream": 0, "frames": _frames(40), "time_us": 4},
        {"action": "oom", "size": 64 * MIB, "device_free": 1 * MIB, "stream": 0, "frames": _frames(50), "time_us": 5},
        {"action": "free_requested", "addr": 200, "size": 16 * MIB, "stream": 0, "frames": [], "time_us": 6},
        {"action": "free_completed", "addr": 200, "size": 16 * MIB, "stream": 0, "frames": [], "time_us": 6},
        {"action": "segment_alloc", "addr": 1 << 41, "size": 2 * MIB, "stream": 0, "frames": [], "time_us": 7},
    ]
    return {"segments": [large, small], "device_traces": [trace], "allocator_settings": {"expandable_segments": False}}


def _write(tmp_path: Path, document: Any, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(document, protocol=pickle.HIGHEST_PROTOCOL))
    return path


def test_json_summary_of_a_documented_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(_write(tmp_path, snapshot())), "--format", "json"]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["segments"] == 2 and device["reserved_bytes"] == 22 * MIB
    assert device["allocated_bytes"] == 10 * MIB and device["requested_bytes"] == 10 * MIB - 1024
    assert device["inactive_bytes"] == 12 * MIB and device["largest_inactive_bytes"] == 6 * MIB
    assert device["fragmentation"] == pytest.approx(0.5)
    assert device["top_sites"] == [
        {"site": "train_step (train.py:10)", "bytes": 8 * MIB, "blocks": 1},
        {"site": "train_step (train.py:20)", "bytes": 2 * MIB, "blocks": 1},
    ]
    # History: net 0, so it started at today's 10 MiB; its peak adds the 16 MiB block from :40.
    assert device["peak_allocated_bytes"] == 26 * MIB
    assert device["peak_sites"] == [{"site": "train_step (train.py:40)", "bytes": 16 * MIB, "blocks": 1}]
    assert device["peak_unattributed_bytes"] == 10 * MIB
    assert (device["segment_allocs"], device["segment_frees"], device["ooms"]) == (2, 0, 1)


def test_terminal_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(_write(tmp_path, snapshot()))]) == 0
    out = capsys.readouterr().out
    assert "22.0 MiB in 2 segment(s)" in out and "fragmentation of the free memory" in out and "50%" in out
    assert "train_step (train.py:40)" in out and "out-of-memory errors" in out


class _Evil:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {os.environ.get('EVIL_MARKER', '/nonexistent/marker')}",))


def test_a_malicious_pickle_is_refused_with_exit_2_and_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    os.environ["EVIL_MARKER"] = str(marker)
    try:
        path = _write(tmp_path, {"segments": [], "x": _Evil()}, "evil.pickle")
    finally:
        del os.environ["EVIL_MARKER"]
    done = subprocess.run([sys.executable, "-m", "torchscope", "memory", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused global" in lines[0] and ("posix.system" in lines[0] or "os.system" in lines[0])
    assert not marker.exists()


@pytest.mark.parametrize(
    "content",
    [b"", b"not a pickle at all", pickle.dumps([1, 2, 3]), pickle.dumps({"segments": "no"}), pickle.dumps(snapshot())[:100]],
    ids=["empty", "garbage", "a list", "segments not a list", "truncated"],
)
def test_bad_snapshots_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    assert main(["memory", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("torchscope: error:")


def test_wrongly_typed_values_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = {"segments": [{"device": 0, "total_size": "big", "blocks": [{"size": None, "state": "active_allocated"}, 7]}, 3],
           "device_traces": [[{"action": "alloc", "addr": "x", "size": 1.5}, "no"]]}  # fmt: skip
    assert main(["memory", str(_write(tmp_path, odd)), "--format", "json"]) == 0
    device = json.loads(capsys.readouterr().out)["devices"][0]
    assert device["reserved_bytes"] == 0 and device["segments"] == 1
