"""Real 2-rank DDP training (gloo, CPU) with gradient accumulation over 4 micro-steps, under
`torchrun -m torchscope run`: every micro-step all-reducing the gradients is found and costed, and
`model.no_sync()` on the first three leaves one sync per step and no finding.

The same run checks the profiler-overhead correction: the all-reduces run inside `loss.backward()`, which
the capture's phase clock times as backward, while the trace calls them communication; communication takes
its part of the clock's backward (it was left the step's untimed remainder, a "60-80x" slowdown)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

from helpers.torchrun_capture import torchrun_capture  # noqa: E402
from torchscope.pipeline.analyze import analyze  # noqa: E402
from torchscope.report.model import Report  # noqa: E402

pytestmark = pytest.mark.slow

# 2.4 M parameters (9.6 MB of gradients per all-reduce) against micro-batches of 8: the syncs are most
# of a micro-step, as in real accumulation over small per-GPU batches.
SCRIPT = textwrap.dedent(
    """
    import contextlib, os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ACCUMULATION, NO_SYNC = 4, os.environ["NO_SYNC"] == "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 2048),
                              torch.nn.ReLU(), torch.nn.Linear(2048, 256))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(8, 256), torch.randn(8, 256)) for _ in range(ACCUMULATION)]
    for step in range(12):
        opt.zero_grad()
        for i, (x, y) in enumerate(batches):
            skip = NO_SYNC and i < ACCUMULATION - 1
            with model.no_sync() if skip else contextlib.nullcontext():
                (torch.nn.functional.mse_loss(model(x), y) / ACCUMULATION).backward()
        opt.step()
    dist.destroy_process_group()
    """
)


def _launch(tmp_path: Path, no_sync: bool) -> Report:
    torchrun_capture(tmp_path, SCRIPT, ranks=2, env={"NO_SYNC": "1" if no_sync else "0"})
    return analyze(tmp_path / "runs")


def test_every_micro_step_syncing_is_found_and_no_sync_clears_it(tmp_path: Path) -> None:
    report = _launch(tmp_path / "every", no_sync=False)
    sync = report.measurements.grad_sync
    assert sync.wrapper == "DistributedDataParallel"
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step) == (4, 4)
    assert sync.redundant_micro_steps_per_step == 3
    assert 0.5 * sync.sync_us_per_step < sync.redundant_sync_us_per_step < sync.sync_us_per_step
    found = next(f for f in report.findings if f.id == "communication.accumulation_sync")
    assert found.fixes[0].target == "DistributedDataParallel.no_sync"
    assert 0 < found.time_share_low < found.time_share < found.time_share_high <= 1
    overhead = report.measurements.profiler_overhead
    if "communication" in overhead.slowdown_by_phase:  # corrected where the clock saw enough overhead
        assert overhead.slowdown_by_phase["communication"] < 5, overhead.slowdown_by_phase

    report = _launch(tmp_path / "no_sync", no_sync=True)
    sync = report.measurements.grad_sync
    assert (sync.micro_steps_per_step, sync.syncing_micro_steps_per_step, sync.redundant_micro_steps_per_step) == (4, 1, 0)
    assert "communication.accumulation_sync" not in {f.id for f in report.findings}
