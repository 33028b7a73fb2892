"""Python's garbage collections: the capture's timer (real collections), the trace's "Python GC" events
(a synthetic trace: which are inside steps, which are the script's own gc.collect()), and the run-level
figures read from the manifest's step clock."""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path
from typing import Iterator

import pytest

import torchscope
from helpers.trace_builder import TraceBuilder
from test_rules_support import report
from torchscope.analysis.garbage_collection import from_step_clock
from torchscope.capture.gc_timer import GcTimer


def test_timer_times_full_collections_apart() -> None:
    timer = GcTimer()
    timer.install()
    try:
        garbage = [[i] for i in range(50_000)]
        for item in garbage:
            item.append(item)  # cycles: only a collection frees them
        del garbage
        timer.take()  # collections the set-up above may have triggered
        gc.collect()  # one full collection (generation 2)
        total, full, count, longest = timer.take()
        assert count == 1 and full > 0 and total == full == longest
        assert timer.take() == (0.0, 0.0, 0, 0.0)  # taken: the next step starts from zero
    finally:
        timer.uninstall()
    assert timer._callback not in gc.callbacks
    gc.collect()
    assert timer.take() == (0.0, 0.0, 0, 0.0)


def test_collections_inside_steps_from_the_trace(tmp_path: Path) -> None:
    b = TraceBuilder()
    for i in range(4):
        t0 = i * 10_000.0
        b.step(i, t0, 10_000)
        b.op("train.py(12): <module>", t0 + 10, 9000, cat="python_function")
        b.op("Python GC", t0 + 100, 300, cat="python_function")  # triggered by an allocation
        b.op("<built-in function collect>", t0 + 5000, 2100, cat="python_function")
        b.op("Python GC", t0 + 5010, 2000, cat="python_function")  # the script's gc.collect()
        b.op("aten::mm", t0 + 8000, 500)
    b.op("Python GC", 50_000, 5000, cat="python_function")  # after the last step: not the steps'
    section = torchscope.analyze(b.write(tmp_path / "trace.json"), jobs=1, use_cache=False).measurements.gc
    assert (section.collections_per_step, section.explicit_collections_per_step) == (2, 1)
    assert section.gc_us_per_step == pytest.approx(2300)
    assert (section.long_pauses_per_step, section.longest_pause_us) == (1, pytest.approx(2000))
    assert section.unprofiled_steps == 0  # a bare trace: no step clock


def test_run_level_figures_from_the_step_clock() -> None:
    times = {"unprofiled_step_us": [10_000.0, 10_000.0, 40_000.0], "unprofiled_gc_us": [500.0, 500.0, 30_500.0],
             "unprofiled_full_gc_us": [0.0, 0.0, 30_000.0], "unprofiled_gc_collections": 12, "gc_longest_pause_us": 30_000.0}
    result = report(manifest={"environment": {"step_times": times}})
    from_step_clock(result)
    section = result.measurements.gc
    assert (section.unprofiled_steps, section.unprofiled_step_mean_us) == (3, pytest.approx(20_000))
    assert section.unprofiled_gc_us_per_step == pytest.approx(31_500 / 3)
    assert section.unprofiled_full_gc_us_per_step == pytest.approx(10_000)
    assert (section.unprofiled_collections_per_step, section.unprofiled_longest_pause_us) == (4, 30_000)
    # Lists that do not pair with the steps (an older or damaged manifest): nothing is stated.
    damaged = report(manifest={"environment": {"step_times": {**times, "unprofiled_gc_us": [1.0]}}})
    from_step_clock(damaged)
    assert damaged.measurements.gc.unprofiled_steps == 0



def test_collections_in_forward_are_not_python_between_operators(tmp_path: Path) -> None:
    """A collection inside the forward is host_overhead.gc_pauses' time: the Python-gap figure of the
    dispatch section leaves it out (else two findings would claim it)."""

    def gap(with_gc: bool) -> float:
        b = TraceBuilder()
        for i in range(4):
            t0 = i * 10_000.0
            b.step(i, t0, 10_000)
            b.annotation("torchscope:forward", t0 + 100, 5000)
            b.op("aten::mm", t0 + 200, 1000)
            if with_gc:
                b.op("Python GC", t0 + 2000, 1500, cat="python_function")
            b.op("aten::mm", t0 + 4000, 1000)
        name = f"trace_{with_gc}.json"
        return torchscope.analyze(b.write(tmp_path / name), jobs=1, use_cache=False).measurements.dispatch.python_gap_us_per_step

    assert gap(with_gc=False) == pytest.approx(3000)  # 5000 us of forward, 2000 us of it in operators
    assert gap(with_gc=True) == pytest.approx(1500)


@contextlib.contextmanager
def _only_our_collections(installed: bool = True) -> Iterator[GcTimer]:
    """A timer, with Python's automatic collections off: each collection in the block is one the test makes."""
    timer = GcTimer()
    if installed:
        timer.install()
    gc.disable()
    try:
        yield timer
    finally:
        gc.enable()
        timer.uninstall()


def test_timer_leaves_dynamo_compilations_collections_to_compilation() -> None:
    # Dynamo allocates enough while it compiles to trigger collections, and runs one itself once its compile
    # callbacks have ended (run_gc_after_compile, in convert_frame.py): compilation's cost, counted in the
    # trace's compile ranges. The timer follows dynamo's callbacks once the script has imported dynamo.
    pytest.importorskip("torch")
    import torch._dynamo.callback as callback

    with _only_our_collections() as timer:
        gc.collect()  # registers the timer on dynamo's callbacks
        timer.take()
        with callback.callback_handler.install_callbacks(callback.CallbackTrigger.DYNAMO, "0/1"):
            gc.collect()  # as dynamo's collections while it compiles
        exec(compile("import gc\ngc.collect(1)", "site-packages/torch/_dynamo/convert_frame.py", "exec"))
        assert timer.take()[2] == 0
        gc.collect()
        assert timer.take()[2] == 1
    assert timer._compile_started not in callback.callback_handler.start_callbacks


def test_timer_registering_in_the_middle_of_a_compilation_leaves_it_to_compilation() -> None:
    # The script's first compilation can start before any collection lets the timer register: the first
    # collection inside it registers the timer, which then knows a compilation is running.
    pytest.importorskip("torch")
    import torch._dynamo.callback as callback

    with _only_our_collections(installed=False) as timer:
        with callback.callback_handler.install_callbacks(callback.CallbackTrigger.DYNAMO, "0/0"):
            timer.install()
            gc.collect()
            assert timer._compiling and timer.take()[2] == 0
        assert not timer._compiling
        gc.collect()
        assert timer.take()[2] == 1
    assert timer._compile_started not in callback.callback_handler.start_callbacks


def test_timer_leaves_a_real_compilations_collections_out() -> None:
    # A real compilation (dynamo's tracing, eager backend): the collections it sets off, and the one dynamo
    # runs itself after its callbacks end (run_gc_after_compile), none timed. Automatic collections are off,
    # so each collection here is one compilation made.
    torch = pytest.importorskip("torch")
    from torch._dynamo import config

    seen: list[int] = []

    def watch(phase: str, info: dict[str, object]) -> None:
        if phase == "start":
            seen.append(1)

    with _only_our_collections() as timer:
        gc.collect()  # registers the timer on dynamo's callbacks
        timer.take()
        gc.callbacks.append(watch)
        try:
            with config.patch(run_gc_after_compile=True):
                torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.randn(3))
            assert seen and timer.take()[2] == 0
        finally:
            gc.callbacks.remove(watch)
