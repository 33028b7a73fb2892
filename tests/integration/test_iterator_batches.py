"""A real capture (`torchscope run`, stacks on) of loops that fetch their batches with next() or from a
queue: from a generator (no DataLoader: PyTorch records no range for it) the fetch is data loading, named
after the generator, with advice for a loop without a DataLoader; from a DataLoader's iterator it stays the
DataLoader's; a wait in Queue.get() for a producer thread is data loading with advice about the producer.
torchscope's own next() calls (contextlib resuming its context managers) are not fetches."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.capture_run import capture
import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

SCRIPT = '''
import queue, sys, threading, time
import torch
from torch import nn
from torch.utils.data import DataLoader


def batches():
    while True:
        time.sleep(0.004)  # reading and tokenizing, in the loop's own process
        yield torch.randn(16, 32)


def produce(out):
    while True:
        time.sleep(0.02)  # a producer thread that does not keep up: 20 ms, far above a loaded step
        out.put(torch.randn(16, 32))


if sys.argv[1] == "queue":
    ready = queue.Queue(maxsize=2)
    threading.Thread(target=produce, args=(ready,), daemon=True).start()
else:
    source = iter(DataLoader([torch.randn(32) for _ in range(256)], batch_size=16)) if sys.argv[1] == "loader" else batches()
model = nn.Linear(32, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    x = ready.get() if sys.argv[1] == "queue" else next(source)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def _capture(tmp_path: Path, source: str) -> torchscope.Report:
    return torchscope.analyze(capture(tmp_path, SCRIPT, "train_next.py", source), jobs=1, use_cache=False)


def test_batches_from_a_generator_are_data_loading(tmp_path: Path) -> None:
    report = _capture(tmp_path, "generator")
    loader = report.measurements.dataloader
    assert loader.iterator_fetches == 3 and loader.single_process_fetches == 0  # one per recorded step
    line = SCRIPT.splitlines().index("def batches():") + 1
    frame, us = next(iter(loader.iterator_frames_us_per_step.items()))
    # A resumed generator is named at the line it resumes from, its yield.
    assert frame == f"batches (train_next.py:{line + 3})" and us > 3500  # the 4 ms sleep, per step
    # The fetch is the step's data loading, not work outside the phases.
    assert report.phases["data_loading"].us > 3500
    assert report.phases["other"].us < report.phases["data_loading"].us / 2  # loaded CI: 1.6 of 4.5 ms
    finding = next(f for f in report.findings if f.id == "data_loading.exposed")
    assert "no DataLoader" in finding.title and frame in finding.recommendation
    assert "IterableDataset" in finding.recommendation and "torch.utils.data.DataLoader" in [f.target for f in finding.fixes]
    assert not any(f.id == "outside_steps.work" for f in report.findings)


def test_next_on_a_dataloader_stays_the_dataloaders(tmp_path: Path) -> None:
    report = _capture(tmp_path, "loader")
    loader = report.measurements.dataloader
    assert loader.single_process_fetches == 3 and loader.iterator_fetches == 0
    assert loader.iterator_frames_us_per_step == {}


def test_waits_on_a_queue_a_producer_fills_are_data_loading(tmp_path: Path) -> None:
    report = _capture(tmp_path, "queue")
    loader = report.measurements.dataloader
    assert loader.queue_waits == 3 and loader.iterator_fetches == 0  # one per recorded step
    assert report.phases["data_loading"].us > report.phases["other"].us
    finding = next(f for f in report.findings if f.id == "data_loading.exposed")
    assert finding.title.endswith("the loop waits for its batches on a queue")
    assert "producer does not keep up" in finding.recommendation and "Raise num_workers" not in finding.recommendation
    assert [f.target for f in finding.fixes] == ["torch.utils.data.DataLoader"]
    assert not any(f.id == "outside_steps.work" for f in report.findings)
