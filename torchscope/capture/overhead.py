"""The profiler's own cost, measured at capture: how long steps take with and without it recording.

With ``with_stack`` on, torch's Python tracer records every Python call; a Python-heavy phase (a
``__getitem__`` in pure Python) then runs 2-3.5x slower while a phase of long operators runs ~1.0x, so
the shares read off the trace overstate the Python-heavy phases. The capture therefore times every step
with its own clock (``time.perf_counter`` between ``step()`` calls, the profiler's own ``step()`` call --
which exports the trace at the end of a window -- left out) and notes, from the schedule, whether the
profiler was recording it. Steps outside the recording (the schedule's ``wait`` steps after the first
step, and up to :data:`REFERENCE_STEPS` steps after the last window, for which the capture keeps its step
hooks) are the unprofiled reference; the analysis
(``analysis/overhead.py``) spreads the difference over each phase in proportion to the events the profiler
recorded there (``docs/capture.md``, "Measurement that does not distort").

The clock also drives the CPU contention sampler (``capture/machine.py``) over the first recorded window.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional

from torchscope.capture.machine import CpuSampler
from torchscope.rundir.config import CaptureConfig

State = Literal["none", "warmup", "record"]
MAX_STEPS_KEPT = 256  # per kind: a long run keeps timing its first unprofiled steps only
REFERENCE_STEPS = 5  # unprofiled steps timed after the last window before the hooks retire


def step_state(config: CaptureConfig, step: int) -> State:
    """What ``torch.profiler.schedule`` does at step ``step`` (0-based), as torch computes it."""
    if step < config.skip_first:
        return "none"
    step -= config.skip_first
    cycle = config.wait + config.warmup + config.active
    if config.repeat > 0 and step // cycle >= config.repeat:
        return "none"
    position = step % cycle
    if position < config.wait:
        return "none"
    return "warmup" if position < config.wait + config.warmup else "record"


class StepClock:
    """Step durations split by whether the profiler recorded them (see the module docstring)."""

    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self.unprofiled_us: list[float] = []
        self.profiled_us: list[float] = []
        self.sampler = CpuSampler()
        self._step = 0  # index of the step now running
        self._started_at: Optional[float] = None
        self._stopped = False

    def start(self) -> None:
        """The profiler started: step 0 runs from now."""
        self._started_at = time.perf_counter()
        self._step = 0
        if step_state(self.config, 0) == "record":
            self.sampler.begin()

    def step_ended(self) -> None:
        """Called just before the profiler's ``step()``: the running step's duration is kept."""
        if self._started_at is None or self._stopped:
            return
        duration = (time.perf_counter() - self._started_at) * 1e6
        state = step_state(self.config, self._step)
        if self._step >= 1:  # step 0 pays one-time costs (lazy initialisation, allocator growth)
            kept = self.unprofiled_us if state == "none" else self.profiled_us if state == "record" else None
            if kept is not None and len(kept) < MAX_STEPS_KEPT:
                kept.append(round(duration, 1))
        if state == "record" and step_state(self.config, self._step + 1) != "record":
            self.sampler.end()  # the first recorded window ends (later calls are ignored)

    def step_started(self) -> None:
        """Called just after the profiler's ``step()``: the next step runs from now."""
        if self._started_at is None or self._stopped:
            return
        self._step += 1
        self._started_at = time.perf_counter()
        now, before = step_state(self.config, self._step), step_state(self.config, self._step - 1)
        entering = now == "record" and before != "record"
        if entering and not self.profiled_us:  # contention over the first recorded window only
            self.sampler.begin()

    def wants_reference(self) -> bool:
        """Whether more unprofiled steps should be timed (the step hooks kept for them after the window)."""
        return not self._stopped and len(self.unprofiled_us) < REFERENCE_STEPS

    def stop(self) -> None:
        """The profiler stopped (failed, stepped aside, closed): later steps are not timed."""
        self._stopped = True
        self.sampler.end()

    def summary(self) -> dict[str, Any]:
        """The manifest's ``timing``: step durations by kind (us) and the contention figures."""
        out: dict[str, Any] = {"unprofiled_step_us": self.unprofiled_us, "profiled_step_us": self.profiled_us}
        contention = self.sampler.summary()
        if contention:
            out["contention"] = contention
        return out
