"""The shares torchscope reports are the ones the training has without a profiler (issue 13).

A Python-heavy data pipeline (a pure-Python ``__getitem__``) runs 2-3x slower under ``with_stack`` while its
operators do not; the report states the shares without that overhead (analysis/overhead.py). Here the same
script is timed by its own ``perf_counter`` around the fetch, the forward+loss, the backward and the
optimizer (zero_grad and step), as torchscope's phases split a step, on every step no profiler recorded
(runs before and after ``torchscope run``, and that run's own steps outside its window: medians over all of
them, so a load change on the shared machine hits both sides), and the reported data-loading and compute
shares must be within 7 percentage points of those; each compute phase (forward, backward, optimizer) must be
within 7 points of the script's timer of the very steps the capture's clock timed unprofiled. The script runs its compute on one intra-op thread, as its loading runs on
one: CPU contention from other processes then slows both alike instead of shifting the shares (the
busy-machine effect trace_quality.busy_machine reports), which is not what this test is about.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import torchscope

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TOLERANCE_PP = 7.0
SAME_STEPS_PP = 3.0  # the capture's clock against the script's timer of the same steps, in the same process
SCRIPT = '''
import json, os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


def feature(i, k):
    return ((i * 31 + k * 17) % 97) / 97.0


class PythonHeavy(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        row = [feature(i, k) for k in range(300)]  # per-sample pure-Python work
        return torch.tensor(row[:128]), i % 10


model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = iter(DataLoader(PythonHeavy(), batch_size=64, num_workers=0))
times = []
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    x, y = next(loader)
    t1 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), y)
    t2 = time.perf_counter()
    optimizer.zero_grad()  # torchscope counts zero_grad with the optimizer
    t3 = time.perf_counter()
    loss.backward()
    t4 = time.perf_counter()
    optimizer.step()
    t5 = time.perf_counter()
    times.append((t1 - t0, t2 - t1, t4 - t3, t5 - t4 + t3 - t2))
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as fh:
        json.dump(times, fh)
'''
PHASES = ("data_loading", "forward", "backward", "optimizer")
STEPS = 36  # the default window records steps 2-4; the capture then times 30 unprofiled steps
FIRST_UNPROFILED = 5
# The 3 recorded steps make ~17 MB of trace, ~60k Python calls: bounded to 4 MiB, the capture drops the
# shortest (capture/thinning.py), and the shares below must not move for it.
BUDGET_MB = 4


def _own_timer(script: Path, out: Path) -> list[list[float]]:
    subprocess.run([sys.executable, str(script), str(STEPS), str(out)], check=True, timeout=300)
    return json.loads(out.read_text())[2:]  # steps 0-1 pay one-time costs


def _median_shares(steps: list[list[float]]) -> dict[str, float]:
    """Each phase's median share of its step, in percent (the statistic the capture's clock uses)."""
    return {name: 100.0 * statistics.median(step[i] / sum(step) for step in steps) for i, name in enumerate(PHASES)}


def _compute_split(steps: list[list[float]], data_share: float) -> dict[str, float]:
    """Each compute phase's share of the step, in percent: the step less data loading (`data_share`) split
    in proportion to the phases' median times per step. Per-phase medians of shares do not add up on a
    busy machine (a descheduling lands 8-12 ms in one phase of a step: the 4 medians summed to 88-94 %),
    and this is the statistic the correction states (measured data share, the rest by per-step medians)."""
    medians = {name: statistics.median(step[i] for step in steps) for i, name in enumerate(PHASES) if i}
    total = sum(medians.values())
    return {name: (100.0 - data_share) * us / total for name, us in medians.items()}


class _Measured(NamedTuple):
    """One capture between two plain runs of the script: the script's timers, the report, the comparison."""

    during: list[list[float]]
    reference: dict[str, float]
    compute_reference: float
    report: torchscope.Report
    run_dir: Path
    summary: str

    @property
    def corrected(self) -> dict[str, float]:
        return self.report.measurements.profiler_overhead.corrected_percent

    def cross_process_gap(self) -> float:
        """The larger of the data-loading and compute gaps to the pooled reference, in pp."""
        compute = sum(self.corrected.get(n, 0.0) for n in ("forward", "backward", "optimizer", "other"))
        return max(abs(self.corrected["data_loading"] - self.reference["data_loading"]),
                   abs(compute - self.compute_reference))


def _measure(directory: Path) -> _Measured:
    directory.mkdir()
    script = directory / "python_heavy.py"
    script.write_text(SCRIPT)
    before = _own_timer(script, directory / "before.json")
    run = subprocess.run(
        [sys.executable, "-m", "torchscope", "run", "--out", str(directory / "run"), "--no-report",
         "--trace-budget-mb", str(BUDGET_MB), str(script),
         str(STEPS), str(directory / "during.json")],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    after = _own_timer(script, directory / "after.json")
    # The reference: the script's own clock on every step no profiler recorded, in plain runs before and
    # after and in the profiled run outside its window (pooled, so that the load at each moment counts).
    during = json.loads((directory / "during.json").read_text())[FIRST_UNPROFILED:]
    reference = _median_shares(before + during + after)
    compute_reference = 100.0 - reference["data_loading"]
    reference |= _compute_split(before + during + after, reference["data_loading"])
    report = torchscope.analyze(directory / "run", jobs=1, use_cache=False)
    recorded = {name: report.phases[name].percent for name in PHASES}
    sources = {name: round(_median_shares(steps)["data_loading"], 1) for name, steps in
               (("before", before), ("during", during), ("after", after))}
    per_phase_medians = {k: round(v, 1) for k, v in _median_shares(before + during + after).items()}
    summary = (f"reference {reference} (data loading by source {sources}; each phase's median share "
               f"{per_phase_medians}), corrected {report.measurements.profiler_overhead.corrected_percent}, "
               f"recorded {recorded}")
    print(summary)
    return _Measured(during, reference, compute_reference, report, directory / "run", summary)


def test_reported_shares_match_an_unprofiled_timer(tmp_path: Path) -> None:
    measured = _measure(tmp_path / "first")
    report, during = measured.report, measured.during
    overhead = report.measurements.profiler_overhead
    assert overhead.method == "fetch_clock", overhead
    assert overhead.unprofiled_steps >= 20
    # The mechanism itself, without the noise between processes: on the very steps the capture's clock timed
    # (the unprofiled steps after the window), its fetch share and the script's own timer agree closely
    # (0.2-0.3 pp measured; before the clock's fixes 2-12 pp at load 5-7, docs/capture.md).
    clock = json.loads((measured.run_dir / "run.json").read_text())["environment"]["step_times"]
    same_steps = during[: len(clock["unprofiled_step_us"])]
    captured = 100.0 * statistics.median(f / s for f, s in zip(clock["unprofiled_fetch_us"], clock["unprofiled_step_us"]))
    paired = _median_shares(same_steps)["data_loading"]
    assert abs(captured - paired) <= SAME_STEPS_PP, (captured, paired, same_steps)
    corrected = overhead.corrected_percent
    # Each compute phase on its own (issue 13, A3), forward with "other" (the functional loss, below), against
    # the script's timer of the steps the capture's clock timed unprofiled: across processes the phases move
    # by more than the tolerance on the loaded 2-core machine (a descheduling doubles a 2 ms forward), within
    # the same steps they do not (docs/capture.md). The pooled reference is printed beside it.
    paired_split = _compute_split(same_steps, paired)
    phases = {"forward": corrected.get("forward", 0.0) + corrected.get("other", 0.0)}
    phases |= {name: corrected.get(name, 0.0) for name in ("backward", "optimizer")}
    print(f"compute phases: corrected {phases}, same steps' timer {paired_split}")
    for name, share in phases.items():
        assert abs(share - paired_split[name]) <= TOLERANCE_PP, (name, phases, paired_split, measured.summary)
    # Against the plain runs (another process, a minute apart): the VM's speed drifts between processes, and
    # unevenly (Python-heavy loading 4.9 against 8.5 ms in consecutive processes, compute alike; the pooled
    # gap reached -7.5 pp once in CI). A gap over the tolerance is measured once more, with fresh processes:
    # a real bias fails both times.
    if measured.cross_process_gap() > TOLERANCE_PP:
        measured = _measure(tmp_path / "again")
    reference, corrected, summary = measured.reference, measured.corrected, measured.summary
    assert abs(corrected["data_loading"] - reference["data_loading"]) <= TOLERANCE_PP, summary
    # The script's forward timer holds the functional loss (cross_entropy is no module: torchscope's "other").
    compute = sum(corrected.get(n, 0.0) for n in ("forward", "backward", "optimizer", "other"))
    assert abs(compute - measured.compute_reference) <= TOLERANCE_PP, summary
    report = measured.report
    overhead = report.measurements.profiler_overhead
    recorded = {name: report.phases[name].percent for name in PHASES}
    # The step time's spread and the interval of its mean, over the recorded and the unprofiled steps.
    st = report.measurements.step_time
    assert st.steps == 3 and st.ci_low_us < st.mean_us < st.ci_high_us and st.cv_percent > 0, st
    assert st.unprofiled_steps == overhead.unprofiled_steps and st.unprofiled_ci_half_percent > 0, st
    traces = list(measured.run_dir.glob("*.pt.trace.json"))
    assert traces and all(t.stat().st_size <= BUDGET_MB << 20 for t in traces)
    assert overhead.python_events_dropped > 0.5 * overhead.python_events_recorded, overhead
    thinned = next(f for f in report.findings if f.id == "trace_quality.trace_thinned")
    assert f"{int(overhead.python_events_dropped):,} of" in thinned.title
    finding = next(f for f in report.findings if f.id == "data_loading.exposed")
    # What the finding says a fix saves is no longer the inflated recorded share (it is the what-if saving,
    # a part of the share): never above the unprofiled share by more than the tolerance.
    assert finding.time_share is not None and 100 * finding.time_share <= reference["data_loading"] + TOLERANCE_PP, summary
    assert 100 * finding.time_share < recorded["data_loading"], summary
