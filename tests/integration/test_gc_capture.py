"""A real capture (`torchscope run`) of a loop that calls gc.collect() every step while the process holds
many long-lived Python objects: the step clock times the full collections in the unprofiled steps, the
trace records them (stacks on) under the script's gc.collect(), and the finding says so. With gc.freeze()
after building those objects, the same loop's collections are much shorter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import gc, sys
import torch
from torch import nn

model = nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
index = [{"id": i, "tags": [i]} for i in range(100_000)]  # long-lived objects a full collection walks
if sys.argv[1] == "frozen":
    gc.freeze()
for step in range(40):
    loss = model(torch.randn(8, 32)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    gc.collect()
'''


def _run(tmp_path: Path, mode: str) -> tuple[torchscope.Report, dict]:
    out = capture(tmp_path, SCRIPT, "train.py", mode)
    times = json.loads(next(out.glob("run*.json")).read_text())["environment"]["step_times"]
    return torchscope.analyze(out, jobs=1, use_cache=False), times


def test_full_collections_are_timed_and_named(tmp_path: Path) -> None:
    report, times = _run(tmp_path, "plain")
    assert len(times["unprofiled_gc_us"]) == len(times["unprofiled_step_us"]) >= 20
    assert all(full > 0 for full in times["unprofiled_full_gc_us"])  # gc.collect() is a full collection
    section = report.measurements.gc
    assert section.explicit_collections_per_step >= 1  # the trace's, under the script's gc.collect()
    assert section.unprofiled_full_gc_us_per_step > 0 and section.unprofiled_longest_pause_us > 0
    (finding,) = [f for f in report.findings if f.id == "host_overhead.gc_pauses"]
    assert finding.evidence["measured"].startswith("over ") and finding.evidence["full_gc_share"] > 0.05
    assert "script's own gc.collect()" in finding.recommendation
    frozen, frozen_times = _run(tmp_path, "frozen")
    # gc.freeze() takes the index out of every collection: the advice's effect, measured by the same clock.
    assert sum(frozen_times["unprofiled_full_gc_us"]) < 0.5 * sum(times["unprofiled_full_gc_us"])
    # Short pauses, and none of the capture's own (step 0, the recorded steps, the trace's export) counted.
    assert frozen.measurements.gc.unprofiled_longest_pause_us < 1000
