"""CPU contention measured at capture (capture/machine.py) and the trace_quality.busy_machine finding that
caps severities on a busy machine; the DataLoader settings the capture records."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from test_rules_support import finding, findings, report
from torchscope.capture import machine
from torchscope.report.measurements import DataLoader, Measurements

STAT = """cpu  900 0 300 5000 10 0 5 0 0 0
cpu0 400 0 100 2500 5 0 2 7 0 0
cpu1 500 0 200 2500 5 0 3 0 0 0
intr 1 2 3
"""


def test_busy_ticks_of_the_allowed_cpus_only() -> None:
    # user + nice + system + irq + softirq + steal; iowait and idle are not busy.
    assert machine.busy_ticks([0], STAT) == 400 + 100 + 2 + 7
    assert machine.busy_ticks([0, 1], STAT) == 509 + 703
    assert machine.busy_ticks([0, 5], STAT) is None  # a CPU without a line: no figure rather than a wrong one


def test_process_ticks_parse_after_a_command_name_with_spaces() -> None:
    fields = ["S"] + ["0"] * 10 + ["11", "7", "5", "3"] + ["0"] * 30
    text = "42 (my (odd) name) " + " ".join(fields)
    assert machine.process_ticks(text) == 11 + 7 + 5 + 3
    assert machine.process_ticks(text, with_children=False) == 18


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@pytest.mark.skipif(not machine.Path("/proc/self/stat").exists(), reason="Linux /proc only")
def test_a_child_process_burning_cpu_is_our_own_time_not_contention() -> None:
    sampler = machine.CpuSampler()
    sampler.begin()
    child = multiprocessing.get_context("fork").Process(target=_burn, args=(0.4,))
    child.start()
    child.join()
    sampler.end()
    figures = sampler.summary()
    assert figures["own_cpu_s"] >= 0.3  # the reaped child's CPU time is counted as ours (cutime)
    assert 0.0 <= figures["other_share"] <= 1.0
    assert figures["wall_s"] > 0 and figures["cpus"] >= 1


def test_contention_figures_from_two_samples() -> None:
    first, last = object.__new__(machine.CpuSample), object.__new__(machine.CpuSample)
    first.wall, first.process_cpu, first.own, first.busy = 10.0, 1.0, 100, 1000
    last.wall, last.process_cpu, last.own, last.busy = 12.0, 2.5, 250, 1400
    figures = machine.contention_figures(first, last, cpus=2, ticks_per_s=100, load=3.5)
    assert figures["process_cpu_per_wall"] == 0.75
    assert (figures["busy_cpu_s"], figures["own_cpu_s"], figures["other_cpu_s"]) == (4.0, 1.5, 2.5)
    assert figures["other_share"] == 0.625  # 2.5 CPU-seconds of 2 CPUs x 2 s
    assert figures["load_average_1m"] == 3.5


def test_a_window_too_short_for_the_tick_counters_states_no_share_of_other_processes() -> None:
    # A 2 ms recorded step: one stray 10 ms tick of another process is not "100 % of the CPUs taken".
    first, last = object.__new__(machine.CpuSample), object.__new__(machine.CpuSample)
    first.wall, first.process_cpu, first.own, first.busy = 10.0, 1.0, 100, 1000
    last.wall, last.process_cpu, last.own, last.busy = 10.002, 1.002, 100, 1001
    figures = machine.contention_figures(first, last, cpus=2, ticks_per_s=100, load=0.2)
    assert figures["other_cpu_s"] == 0.01 and "other_share" not in figures
    # The shortest window that states it: 3 ticks of error (2 CPUs and our own) within a tenth of 2 x 0.15 s.
    last.wall = 10.15
    assert machine.contention_figures(first, last, cpus=2, ticks_per_s=100, load=0.2)["other_share"] == round(0.01 / 0.3, 4)
    quiet = report(breakdown={"forward": 0.5}, manifest={"environment": {"contention": figures}})
    assert "trace_quality.busy_machine" not in findings(quiet)


@pytest.mark.skipif(not machine.Path("/proc/stat").exists(), reason="Linux /proc only")
def test_a_short_window_is_extended_to_the_first_boundary_that_resolves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three fast recorded steps end the window after 30 ms: too short on any CPU count. The sampler keeps
    # measuring; the next step boundary past the shortest window ends it, and the share is stated.
    sampler = machine.CpuSampler()
    sampler.begin()
    start = sampler._first.wall  # type: ignore[union-attr]
    monkeypatch.setattr(machine.time, "monotonic", lambda: start + 0.03)
    sampler.end()
    assert sampler._last is None
    sampler.poll()
    assert sampler._last is None  # still too short
    monkeypatch.setattr(machine.time, "monotonic", lambda: start + sampler._shortest_s + 0.01)
    sampler.poll()
    figures = sampler.summary()
    assert figures["wall_s"] >= sampler._shortest_s and "other_share" in figures
    # A run that stops first ends it whatever its length (finish): the share is then left out.
    short = machine.CpuSampler()
    short.begin()
    first = short._first.wall  # type: ignore[union-attr]
    monkeypatch.setattr(machine.time, "monotonic", lambda: first + 0.02)
    short.end()
    short.finish()
    assert short._last is not None and "other_share" not in short.summary()


class _Dataset:
    def __getitem__(self, index: int) -> int:
        return index


class _Loader:
    def __init__(self, **settings: Any) -> None:
        self.dataset = _Dataset()
        self.__dict__.update(settings)


def test_loader_registry_records_each_loader_once_with_its_iterations() -> None:
    registry = machine.LoaderRegistry()
    train = _Loader(num_workers=2, pin_memory=False, batch_size=32, persistent_workers=True, prefetch_factor=4)
    for _ in range(3):
        registry.note(train)
    registry.note(_Loader(num_workers=0, batch_size=64))
    first, second = registry.loaders
    assert first["num_workers"] == 2 and first["prefetch_factor"] == 4 and first["iterations"] == 3
    assert first["dataset"] == "_Dataset" and first["getitem"].endswith(f"test_contention.py:{_Dataset.__getitem__.__code__.co_firstlineno}")
    assert second["num_workers"] == 0 and second["iterations"] == 1


def test_loader_registry_wraps_and_restores_dataloader_iter() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    original = torch_data.DataLoader.__iter__
    registry = machine.LoaderRegistry()
    registry.install()
    try:
        loader = torch_data.DataLoader(list(range(8)), batch_size=4, num_workers=0)
        assert [len(b) for b in loader] == [4, 4]
    finally:
        registry.uninstall()
    assert torch_data.DataLoader.__iter__ is original
    assert registry.loaders[0]["batch_size"] == 4 and registry.loaders[0]["num_workers"] == 0


def _busy(other_share: float) -> dict[str, Any]:
    return {"environment": {"contention": {"other_share": other_share, "cpus": 2, "wall_s": 1.0, "process_cpu_per_wall": 0.9}}}


def test_busy_machine_finding_caps_every_severity_at_warning() -> None:
    measurements = Measurements(dataloader=DataLoader(single_process_fetches=8))
    quiet = report(measurements=measurements, breakdown={"data_loading": 0.6}, manifest=_busy(0.1))
    assert finding(quiet, "data_loading.exposed").severity == "critical"
    assert "trace_quality.busy_machine" not in findings(quiet)
    busy = report(measurements=measurements, breakdown={"data_loading": 0.6}, manifest=_busy(0.6))
    f = finding(busy, "trace_quality.busy_machine")
    assert f.severity == "warning" and "60 %" in f.title
    assert f.evidence["multi_threaded_slowdown_up_to"] == 2.5  # 1 / (1 - 0.6)
    assert finding(busy, "data_loading.exposed").severity == "warning"  # capped, and says why above


def test_the_runs_other_ranks_on_the_node_are_no_other_process() -> None:
    # 2 ranks on 2 CPUs (torchrun --nproc_per_node=2): the CPU "others" used in the window is the other
    # rank's, as much as this rank's tree used. Beyond it, a real other process still counts.
    def manifest(other_s: float) -> dict[str, Any]:
        contention = {"other_share": other_s / 2.0, "other_cpu_s": other_s, "own_cpu_s": 0.7, "cpus": 2, "wall_s": 1.0,
                      "process_cpu_per_wall": 0.7}
        return {"environment": {"contention": contention, "local_world_size": 2}}

    assert "trace_quality.busy_machine" not in findings(report(manifest=manifest(0.76)))
    f = finding(report(manifest=manifest(1.7)), "trace_quality.busy_machine")
    assert "50 %" in f.title and "beyond the run's other ranks" in f.title  # (1.7 - 0.7) / 2 CPUs
