"""`run --memory-snapshot` (capture/memory_snapshot.py) without a GPU: the recorder against a stand-in
for torch.cuda that writes what `_dump_snapshot` writes, and its CPU no-op."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from test_memory_snapshot import snapshot
from torchscope.capture.memory_snapshot import MAX_ENTRIES, SnapshotRecorder
from torchscope.cli import main
from torchscope.rundir.layout import is_trace_name, memory_snapshot_name


class FakeCuda:
    def __init__(self, available: bool) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.memory = SimpleNamespace(_record_memory_history=self._record, _dump_snapshot=self._dump)
        self._available = available

    def is_available(self) -> bool:
        return self._available

    def _record(self, enabled: Any = "all", max_entries: int = 1) -> None:
        self.calls.append(("record", enabled if enabled is None else max_entries))

    def _dump(self, filename: str) -> None:
        self.calls.append(("dump", Path(filename).name))
        Path(filename).write_bytes(pickle.dumps(snapshot()))


def test_snapshot_is_written_beside_the_trace_and_readable(tmp_path: Path, capsys: Any) -> None:
    cuda = FakeCuda(available=True)
    problems: list[str] = []
    recorder = SnapshotRecorder(SimpleNamespace(cuda=cuda), problems.append, problems.append)
    recorder.start()
    path = recorder.save(tmp_path, "host_123")
    assert recorder.save(tmp_path, "host_123") == path  # once
    assert path == tmp_path / memory_snapshot_name("host_123") and not is_trace_name(path.name)
    assert cuda.calls == [("record", MAX_ENTRIES), ("dump", f".{path.name}.tmp"), ("record", None)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name] and problems == []
    assert main(["memory", str(path), "--format", "json"]) == 0
    assert '"peak_allocated_bytes": 27262976' in capsys.readouterr().out


def test_without_cuda_it_says_so_once_and_records_nothing(tmp_path: Path) -> None:
    cuda = FakeCuda(available=False)
    notices: list[str] = []
    recorder = SnapshotRecorder(SimpleNamespace(cuda=cuda), [].append, notices.append)
    recorder.start()
    assert recorder.save(tmp_path, "w") is None and cuda.calls == [] and list(tmp_path.iterdir()) == []
    assert len(notices) == 1 and "no CUDA device" in notices[0]
