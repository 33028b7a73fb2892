"""Memory rules (diagnose/rules_memory.py) on hand-built Reports: each states the measurements it sees."""

from __future__ import annotations

import pytest
from test_rules_support import finding, findings, gpu, report
from torchscope.diagnose.engine import diagnose
from torchscope.report.measurements import Measurements, Memory
from torchscope.report.model import MemoryGrowth, MemorySummary

MIB = 1024 * 1024


def _leaky(slope: float = 4 * MIB, r2: float = 0.99, steps: float = 5.0, low: float = 3 * MIB) -> dict:  # type: ignore[type-arg]
    measurements = Measurements(
        memory=Memory(
            growth_bytes_per_step={"cuda:0": slope},
            growth_r2={"cuda:0": r2},
            growth_steps={"cuda:0": steps},
            leak_sites_bytes_per_step={"train (train.py:10) > torch.ones": slope},
            peak_allocated_bytes={"cuda:0": 10 * 2**30},
        )
    )
    memory = MemorySummary(
        present=True,
        peak_allocated_bytes={"cuda:0": 10 * 2**30},
        growth={"cuda:0": MemoryGrowth(bytes_per_step=slope, low_bytes_per_step=low, r2=r2, boundaries=int(steps) + 1)},
    )
    return {"measurements": measurements, "memory": memory, "device": gpu()}


def test_leak_names_slope_site_and_steps_until_full() -> None:
    leak = finding(report(**_leaky()), "memory.leak")
    assert leak.severity == "warning" and leak.time_share is None
    assert leak.evidence["growth_bytes_per_step"] == 4 * MIB
    assert "train.py:10" in leak.title
    # 80 GiB device, 10 GiB in use, 4 MiB per step: 70 GiB / 4 MiB steps left.
    assert leak.evidence["steps_until_full"] == (70 * 2**30) // (4 * MIB)


def test_no_leak_when_the_fit_is_not_a_line_or_the_interval_reaches_zero() -> None:
    assert "memory.leak" not in findings(report(**_leaky(r2=0.5)))
    assert "memory.leak" not in findings(report(**_leaky(low=0.0)))
    assert "memory.leak" not in findings(report(**_leaky(steps=1.0)))
    assert "memory.leak" in findings(report(**_leaky(steps=2.0)))  # 3 boundaries: a 3-step CPU capture's line
    assert "memory.leak" not in findings(report(**_leaky(slope=100_000.0)))


def test_leak_on_cpu_has_no_steps_until_full() -> None:
    leaky = _leaky()
    section = leaky["measurements"].memory
    for field in ("growth_bytes_per_step", "growth_r2", "growth_steps"):
        values = getattr(section, field)
        values["cpu"] = values.pop("cuda:0")
    leaky["memory"].growth = {"cpu": leaky["memory"].growth.pop("cuda:0")}
    leak = finding(report(**leaky), "memory.leak")
    assert leak.evidence["device"] == "cpu" and leak.evidence["steps_until_full"] is None


def test_a_site_without_a_name_is_not_named() -> None:
    """A trace without stacks gives its blocks no call site: "(unknown)" stays in the evidence only."""
    leaky = _leaky()
    leaky["measurements"].memory.leak_sites_bytes_per_step = {"(unknown)": 4 * MIB}
    leak = finding(report(**leaky), "memory.leak")
    assert leak.title == "Memory on cuda:0 grows by 4.0 MiB every step" and "(unknown)" not in leak.recommendation
    assert leak.evidence["surviving_bytes_per_step_by_call_site"] == {"(unknown)": 4 * MIB}


def test_growth_of_blocks_perhaps_freed_unseen_is_no_leak_but_says_why() -> None:
    """The leak rule judges the line without the blocks perhaps freed unseen; where only the recorded line
    rises, trace_quality.unrecorded_frees says so (no verdict), never memory.leak."""
    leaky = _leaky()
    section = leaky["measurements"].memory
    section.leak_growth_bytes_per_step, section.leak_growth_r2 = {"cuda:0": 0.1 * MIB}, {"cuda:0": 0.2}
    section.unrecorded_frees_per_step = {"cuda:0": 0.25}
    section.doubtful_bytes_per_step = {"cuda:0": 3.9 * MIB}
    found = findings(report(**leaky))
    assert "memory.leak" not in found
    quality = finding(report(**leaky), "trace_quality.unrecorded_frees")
    assert quality.severity == "info" and quality.time_share is None and quality.category == "trace_quality"
    assert quality.title.startswith("Memory on cuda:0 seems to grow by 4.0 MiB every step, but the trace misses frees")
    assert quality.evidence["unrecorded_frees_per_step"] == 0.25 and quality.evidence["doubtful_bytes_per_step"] == pytest.approx(3.9 * MIB, abs=1)
    assert "train (train.py:10) > torch.ones" in quality.recommendation and "3.9 MiB per step" in quality.recommendation
    # Without a lost free, the doubt is the collectives' buffers.
    section.unrecorded_frees_per_step = {}
    assert "collectives' buffers" in finding(report(**leaky), "trace_quality.unrecorded_frees").title
    # A line that is no leak by the thresholds is no finding either way.
    leaky = _leaky(r2=0.5)
    assert not {"memory.leak", "trace_quality.unrecorded_frees"} & set(findings(report(**leaky)))
    # The line without them still rising is a leak, stated at its own slope.
    leaky = _leaky()
    section = leaky["measurements"].memory
    section.leak_growth_bytes_per_step, section.leak_growth_r2 = {"cuda:0": 2 * MIB}, {"cuda:0": 0.99}
    section.doubtful_bytes_per_step = {"cuda:0": 2 * MIB}
    leak = finding(report(**leaky), "memory.leak")
    assert leak.title.startswith("Memory on cuda:0 grows by 2.0 MiB every step")
    assert leak.evidence["recorded_growth_bytes_per_step"] == 4 * MIB and "trace_quality.unrecorded_frees" not in findings(report(**leaky))


def test_the_top_site_is_named_only_if_it_has_a_name() -> None:
    """"(unknown)" holding most of the growth: the title names no site rather than a minor one."""
    leaky = _leaky()
    leaky["measurements"].memory.leak_sites_bytes_per_step = {"(unknown)": 3.9 * MIB, "train (train.py:10) > torch.ones": 0.1 * MIB}
    leak = finding(report(**leaky), "memory.leak")
    assert leak.title == "Memory on cuda:0 grows by 4.0 MiB every step" and "train.py:10" in leak.recommendation


def test_churn_is_a_hint_above_32_mib_and_a_quarter_of_the_peak() -> None:
    def churn(per_step: float, peak: float) -> Measurements:
        return Measurements(memory=Memory(churn_bytes_per_step={"cpu": per_step}, peak_allocated_bytes={"cpu": peak}))

    found = findings(report(measurements=churn(100 * MIB, 120 * MIB)))
    assert found["memory.churn"].severity == "info" and found["memory.churn"].evidence["churn_bytes_per_step"] == 100 * MIB
    assert "memory.churn" not in findings(report(measurements=churn(16 * MIB, 20 * MIB)))
    assert "memory.churn" not in findings(report(measurements=churn(100 * MIB, 4000 * MIB)))


def test_fragmentation_costs_the_allocator_calls_and_ignores_the_cpu() -> None:
    calls = Measurements(memory=Memory(allocator_calls_per_step=12.0, allocator_us_per_step=1_000.0))
    frag = finding(report(measurements=calls, device=gpu()), "memory.fragmentation")
    assert frag.time_share == 0.1 and frag.severity == "warning"
    assert frag.fixes[0].target == "PYTORCH_CUDA_ALLOC_CONF" and frag.fixes[0].value == "expandable_segments:True"
    gap = Measurements(memory=Memory(peak_reserved_bytes={"cuda:0": 6 * 2**30}, peak_allocated_bytes={"cuda:0": 2 * 2**30}))
    frag = finding(report(measurements=gap, device=gpu()), "memory.fragmentation")
    assert frag.time_share is None and frag.evidence["device"] == "cuda:0"
    cpu_gap = Measurements(memory=Memory(peak_reserved_bytes={"cpu": 6 * 2**30}, peak_allocated_bytes={"cpu": 2**30}))
    assert "memory.fragmentation" not in findings(report(measurements=cpu_gap))


def test_memory_findings_without_a_cost_rank_after_time_findings() -> None:
    leaky = _leaky()
    ranked = diagnose(report(breakdown={"data_loading": 0.4, "forward": 0.6}, phases={"data_loading": 0.4}, **leaky))
    ids = [f.id for f in ranked]
    assert ids.index("data_loading.exposed") < ids.index("memory.leak")
