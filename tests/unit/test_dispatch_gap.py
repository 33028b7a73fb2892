"""The dispatch section's Python gap: forward/backward time on the main thread covered by no operator,
less what is not the user's Python between operators (torchscope's own hooks; garbage collections are in
test_garbage_collection.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import torchscope
from helpers.trace_builder import TraceBuilder


def _gap(tmp_path: Path, own_hook: bool) -> float:
    b = TraceBuilder()
    for i in range(4):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000)
        b.annotation("torchscope:forward", t0 + 100, 5000)
        if own_hook:  # the phase labels' module pre-hook, slowed by the tracer: measurement overhead
            b.op("torchscope/capture/phases.py(241): _forward_pre", t0 + 150, 40, cat="python_function")
            b.op("/usr/lib/python3/site-packages/torchscope/capture/phases.py(241): _forward_pre", t0 + 1300, 700, cat="python_function")
        b.op("aten::mm", t0 + 200, 1000)
        # torchscope's wrapper around the user's backward call holds operators: its gaps are the user's.
        b.op("torchscope/capture/phases.py(341): backward", t0 + 3000, 2000, cat="python_function")
        b.op("aten::mm", t0 + 3500, 1000)
    report = torchscope.analyze(b.write(tmp_path / f"t{own_hook}.json"), jobs=1, use_cache=False)
    return report.measurements.dispatch.python_gap_us_per_step


def test_torchscopes_own_hooks_are_not_the_users_python(tmp_path: Path) -> None:
    assert _gap(tmp_path, own_hook=False) == pytest.approx(3000)  # 5000 us of forward, 2000 of it in operators
    assert _gap(tmp_path, own_hook=True) == pytest.approx(3000 - 40 - 700)


def test_the_users_module_hooks_are_their_own_finding(tmp_path: Path) -> None:
    """A hook of the user's (called by torch's module call, not a forward method) is measured on its own
    and left out of the gap; the user module's forward stays in it."""
    b = TraceBuilder()
    for i in range(4):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000)
        b.annotation("torchscope:forward", t0 + 100, 5000)
        b.op("torch/nn/modules/module.py(1794): inner", t0 + 150, 4000, cat="python_function")
        b.op("train.py(30): forward", t0 + 160, 1500, cat="python_function")  # the module's own forward
        b.op("aten::mm", t0 + 200, 1000)
        b.op("train.py(4): record", t0 + 2000, 800, cat="python_function")  # a forward hook
        b.op("aten::item", t0 + 2100, 100)
    report = torchscope.analyze(b.write(tmp_path / "hooks.json"), jobs=1, use_cache=False)
    hooks = report.measurements.module_hooks
    assert (hooks.calls_per_step, hooks.hooks_us_by_name) == (1, {"record (train.py:4)": pytest.approx(800)})
    assert report.measurements.dispatch.python_gap_us_per_step == pytest.approx(5000 - 1000 - 800)
