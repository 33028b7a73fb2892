"""The manifest records the backend the process group reports, whatever it is: the capture asks
`torch.distributed.get_backend()` while tracing and knows no backend by name. On the CPU a real 1-rank gloo
group stands in, with `get_backend` answering "nccl" as it does under an NCCL launch; the real NCCL launch
is tests/integration/test_capture_torchrun_nccl.py (GPUs only)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import torch.distributed as dist  # noqa: E402

import torchscope  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def capture(out: Path) -> dict[str, object]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.profile(out=out, skip_first=0, wait=0, warmup=1, active=2) as prof:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            prof.step()
    [manifest] = sorted(Path(prof.run_dir).glob("run*.json"))
    return dict(json.loads(manifest.read_text()))


@pytest.mark.parametrize("reported", ["nccl", "mpi"])
def test_manifest_records_the_backend_the_process_group_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reported: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        monkeypatch.setattr(dist, "get_backend", lambda group=None: reported)
        manifest = capture(tmp_path / "run")
    finally:
        monkeypatch.undo()
        dist.destroy_process_group()
    assert manifest["status"] == "complete"
    assert manifest["backend"] == reported


def test_no_process_group_records_no_backend(tmp_path: Path) -> None:
    assert not dist.is_initialized()
    assert capture(tmp_path / "run").get("backend") is None
