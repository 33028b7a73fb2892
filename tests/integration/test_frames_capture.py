"""Which Python frames are the user's, on frame names torch's own tracer writes (analysis/frames.py).

PyTorch's tracer cuts the sys.path entry off each file, so a standard module (`contextlib.py`) and a script
beside the user's entry point (`trace.py`, named like the standard `trace` module) both come without a
folder: the user's functions must stay theirs, the standard library's must not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torchscope.analysis.frames import is_user_frame

SCRIPT = '''
import contextlib, json, sys
import torch
from torch.profiler import ProfilerActivity, profile

def train_step():
    with contextlib.nullcontext():
        return torch.ones(3) + 1

with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    train_step()
prof.export_chrome_trace(sys.argv[1])
'''


def test_a_users_trace_py_is_theirs_and_the_standard_library_beside_it_is_not(tmp_path: Path) -> None:
    (tmp_path / "trace.py").write_text(SCRIPT)
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "trace.py", str(out)], cwd=tmp_path, check=True, capture_output=True, timeout=120)
    events = json.loads(out.read_text())["traceEvents"]
    frames = {e["name"] for e in events if e.get("cat") == "python_function" and "): " in e["name"]}
    user = {name for name in frames if is_user_frame(name)}
    assert {name.split("): ")[1] for name in user} == {"train_step", "<module>"}, frames
    assert all(name.startswith("trace.py(") for name in user)
    assert any(name.startswith("contextlib.py(") for name in frames - user)  # written bare, and not the user's
