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

Each step's DataLoader fetch time is timed too (:class:`FetchTimer`), so the unprofiled steps give the
data-loading share without any profiler, measured rather than modelled; and so is each phase the phase
hooks open and close (forward, backward, optimizer: :meth:`StepClock.phase_ended`), so the compute phases'
split comes from 30 unprofiled steps too, not from the 3 recorded ones, where one descheduling on a busy
machine moves a phase's median.

Python's garbage collections in the unprofiled steps are timed too (:class:`~torchscope.capture.gc_timer.GcTimer`):
a full collection is a pause of up to hundreds of milliseconds that the 3 recorded steps rarely hold.

The clock also drives the CPU contention sampler (``capture/machine.py``) over the first recorded window,
reading ``/proc`` (milliseconds) outside the recorded steps: before the profiler's ``step()`` that starts the
window and after the one that ends it.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any, Callable, Literal, Optional

from torchscope.capture.gc_timer import GcTimer
from torchscope.capture.machine import CpuSampler
from torchscope.capture.patching import Patch
from torchscope.rundir.config import CaptureConfig
from torchscope.rundir.labels import PHASE_LABELS

State = Literal["none", "warmup", "record"]
MAX_STEPS_KEPT = 256  # per kind: a long run keeps timing its first unprofiled steps only
REFERENCE_STEPS = 30  # unprofiled steps timed after the last window before the hooks retire
_PHASE_OF_LABEL = {label: name for name, label in PHASE_LABELS.items()}


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


class FetchTimer:
    """Time spent in DataLoader fetches (``_BaseDataLoaderIter.__next__``), outermost calls only, summed
    until :meth:`take`. Two ``perf_counter`` calls per batch: cheap enough to time unprofiled steps.

    It also times the worker processes' turnover, summed until :meth:`take_restarts`: starting them again
    (``_MultiProcessingDataLoaderIter.__init__`` for a DataLoader that started workers before: each epoch
    without ``persistent_workers``), the new iterator's first fetch (it waits for them to boot, and for the
    first batch, which persistent workers would load too: kept apart) and the fetch that ends an epoch and
    shuts them down (``StopIteration`` of a multi-process iterator without ``persistent_workers``)."""

    def __init__(self) -> None:
        self._total = 0.0
        self._cpu = 0.0  # this process's CPU time during the fetches: does loading compute or wait?
        self._restart = 0.0
        self._first_fetch = 0.0  # the part of _restart spent in the new iterators' first fetch
        self._restarts = 0
        self._fresh: weakref.WeakSet[Any] = weakref.WeakSet()  # iterators whose workers just restarted
        self._started_loaders: weakref.WeakSet[Any] = weakref.WeakSet()  # DataLoaders that started workers
        self._local = threading.local()
        self._patch: Optional[Patch] = None
        self._start_patch: Optional[Patch] = None
        self.active = False

    def install(self) -> None:
        """Wrap the fetch and the workers' start (a no-op without torch's DataLoader)."""
        if self._patch is not None:
            return
        try:
            from torch.utils.data import dataloader
        except Exception:
            return
        self._patch = Patch(dataloader._BaseDataLoaderIter, "__next__", self._wrap)
        self._patch.install()
        starting = getattr(dataloader, "_MultiProcessingDataLoaderIter", None)
        if starting is not None:
            self._start_patch = Patch(starting, "__init__", self._wrap_start)
            self._start_patch.install()
        self.active = True

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def __next__(iterator: Any) -> Any:
            if not timer.active or getattr(timer._local, "inside", False):
                return original(iterator)
            timer._local.inside = True
            started, cpu = time.perf_counter(), time.process_time()
            first = ending = False
            try:
                first = timer._is_fresh(iterator)
                return original(iterator)
            except StopIteration:
                # The epoch's end: a multi-process iterator without persistent workers shuts them down here.
                ending = getattr(iterator, "_num_workers", 0) > 0 and getattr(iterator, "_persistent_workers", True) is False
                raise
            finally:
                # CPU time read inside the wall interval: on a busy machine process_time() (a syscall) is
                # where the process is most often descheduled, and a stall after the wall read was counted
                # as the step's compute (the data share read up to 10 points low at load 7 on 2 cores).
                timer._cpu += time.process_time() - cpu
                elapsed = time.perf_counter() - started
                timer._total += elapsed
                if first or ending:
                    timer._restart += elapsed
                if first:
                    timer._first_fetch += elapsed
                timer._local.inside = False

        return __next__

    def _wrap_start(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def __init__(iterator: Any, *args: Any, **kwargs: Any) -> None:
            restarting = timer._restarting(args[0] if args else kwargs.get("loader"))  # each start is followed
            if not timer.active or not restarting:
                return original(iterator, *args, **kwargs)
            started = time.perf_counter()
            try:
                return original(iterator, *args, **kwargs)
            finally:
                timer._restart += time.perf_counter() - started
                timer._restarts += 1
                try:
                    timer._fresh.add(iterator)
                except TypeError:  # not weak-referenceable: its first fetch goes uncounted
                    pass

        return __init__

    def _restarting(self, loader: Any) -> bool:
        """Whether this start of `loader`'s workers is a restart (never raises): its first start is not,
        and persistent workers are started once."""
        try:
            if loader in self._started_loaders:
                return getattr(loader, "persistent_workers", False) is False
            self._started_loaders.add(loader)
        except TypeError:  # not weak-referenceable or hashable: not followed
            pass
        return False

    def _is_fresh(self, iterator: Any) -> bool:
        """Whether `iterator` restarted its workers and has not fetched yet (taken off; never raises)."""
        try:
            if iterator in self._fresh:
                self._fresh.discard(iterator)
                return True
        except TypeError:
            pass
        return False

    def uninstall(self) -> None:
        """Stop timing and take the wrappers off (each passes through if another patch holds it)."""
        self.active = False
        for patch in (self._patch, self._start_patch):
            if patch is not None:
                patch.uninstall()
        self._patch = self._start_patch = None

    def take_restarts(self) -> tuple[float, float, int]:
        """(seconds in the workers' turnover, of them in first fetches, restarts) since the last call."""
        taken = (self._restart, self._first_fetch, self._restarts)
        self._restart, self._first_fetch, self._restarts = 0.0, 0.0, 0
        return taken

    def take(self) -> tuple[float, float]:
        """(wall, process CPU) time of the fetches since the last call, in us."""
        total, cpu, self._total, self._cpu = self._total, self._cpu, 0.0, 0.0
        return total * 1e6, cpu * 1e6


class StepClock:
    """Step durations split by whether the profiler recorded them (see the module docstring)."""

    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self.unprofiled_us: list[float] = []
        self.unprofiled_fetch_us: list[float] = []  # DataLoader fetch time of each unprofiled step
        self.profiled_us: list[float] = []
        # Each phase's time in each unprofiled step (the phase hooks' ranges, paired with unprofiled_us).
        self.unprofiled_phase_us: dict[str, list[float]] = {name: [] for name in PHASE_LABELS}
        self._phase_s: dict[str, float] = {}  # the running step's phase times, while it is unprofiled
        self._timing_phases = False
        self.fetches = FetchTimer()
        self.collections = GcTimer()
        self.unprofiled_restart_us: list[float] = []  # DataLoader workers' turnover in each unprofiled step
        self.unprofiled_first_fetch_us: list[float] = []  # ... of it, the restarted iterators' first fetch
        self._restarts = 0
        self.unprofiled_gc_us: list[float] = []  # garbage collections in each unprofiled step, all generations
        self.unprofiled_full_gc_us: list[float] = []  # ... full ones (generation 2)
        self._gc_count = 0
        self._gc_longest_s = 0.0
        self._cpu_at_start = 0.0
        self._cpu_us = {"fetch_wall": 0.0, "fetch_cpu": 0.0, "rest_wall": 0.0, "rest_cpu": 0.0}  # unprofiled steps
        self.sampler = CpuSampler()
        self._step = 0  # index of the step now running
        self._started_at: Optional[float] = None
        self._stopped = False

    def start(self) -> None:
        """The profiler started: step 0 runs from now."""
        self._started_at = time.perf_counter()
        self._cpu_at_start = time.process_time()
        self._step = 0
        self._timing_phases = step_state(self.config, 0) == "none"
        self.fetches.install()
        self.collections.install()
        if step_state(self.config, 0) == "record":
            self.sampler.begin()

    def step_ended(self) -> None:
        """Called just before the profiler's ``step()``: the running step's duration is kept."""
        if self._started_at is None or self._stopped:
            return
        duration = (time.perf_counter() - self._started_at) * 1e6
        cpu = (time.process_time() - self._cpu_at_start) * 1e6
        fetch, fetch_cpu = self.fetches.take()
        restart, first_fetch, restarts = self.fetches.take_restarts()
        collected, collected_full, collections, longest = self.collections.take()
        state = step_state(self.config, self._step)
        if self._step >= 1:  # step 0 pays one-time costs (lazy initialisation, allocator growth)
            kept = self.unprofiled_us if state == "none" else self.profiled_us if state == "record" else None
            if kept is not None and len(kept) < MAX_STEPS_KEPT:
                kept.append(round(duration, 1))
                if state == "none":
                    self.unprofiled_fetch_us.append(round(min(fetch, duration), 1))
                    self.unprofiled_restart_us.append(round(min(restart * 1e6, duration), 1))
                    self.unprofiled_first_fetch_us.append(round(min(first_fetch * 1e6, duration), 1))
                    self._restarts += restarts
                    self.unprofiled_gc_us.append(round(min(collected * 1e6, duration), 1))
                    self.unprofiled_full_gc_us.append(round(min(collected_full * 1e6, duration), 1))
                    self._gc_count += collections
                    self._gc_longest_s = max(self._gc_longest_s, longest)  # the unprofiled steps' only
                    for name, times in self.unprofiled_phase_us.items():
                        times.append(round(min(self._phase_s.get(name, 0.0) * 1e6, duration), 1))
                    self._cpu_us["fetch_wall"] += fetch
                    self._cpu_us["fetch_cpu"] += fetch_cpu
                    self._cpu_us["rest_wall"] += max(duration - fetch, 0.0)
                    self._cpu_us["rest_cpu"] += max(cpu - fetch_cpu, 0.0)
        if state != "record" and step_state(self.config, self._step + 1) == "record" and not self.profiled_us:
            self.sampler.begin()  # before the profiler's step(): reading /proc stays out of the recorded step

    def step_started(self) -> None:
        """Called just after the profiler's ``step()``: the next step runs from now."""
        if self._started_at is None or self._stopped:
            return
        self._step += 1
        self._phase_s = {}
        self._timing_phases = step_state(self.config, self._step) == "none"
        if step_state(self.config, self._step - 1) == "record" and step_state(self.config, self._step) != "record":
            self.sampler.end()  # after the profiler's step(): the window has ended (later calls are ignored)
        else:
            self.sampler.poll()  # a window too short for /proc's ticks ends at the first boundary that suffices
        if self.fetches._patch is not None:
            # Fetches are timed only in the steps kept as unprofiled: in a recorded step the timer's clock reads
            # (syscalls, where a busy machine deschedules) sit outside torch's fetch range, as "other" time.
            self.fetches.active = step_state(self.config, self._step) == "none"
        self.collections.take()  # those inside the profiler's own step() (the trace's export) are not the step's
        self._cpu_at_start = time.process_time()  # before the wall clock: a stall in it is not the step's
        self._started_at = time.perf_counter()

    def phase_ended(self, label: str, seconds: float) -> None:
        """A phase range closed after `seconds` (the phase hooks' callback): summed into the running step
        when it is unprofiled (in a recorded step the time holds the profiler's cost)."""
        name = _PHASE_OF_LABEL.get(label)
        if self._timing_phases and name is not None:
            self._phase_s[name] = self._phase_s.get(name, 0.0) + seconds

    def wants_reference(self) -> bool:
        """Whether more unprofiled steps should be timed (the step hooks kept for them after the window)."""
        if self._stopped or len(self.unprofiled_us) >= REFERENCE_STEPS:
            self.fetches.uninstall()  # nothing more to time: the rest of the run pays nothing
            self.collections.uninstall()
            return False
        return True

    def stop(self) -> None:
        """The profiler stopped (failed, stepped aside, closed): later steps are not timed."""
        self._stopped = True
        self.fetches.uninstall()
        self.collections.uninstall()
        self.sampler.finish()

    def summary(self) -> dict[str, Any]:
        """The manifest's ``timing``: step durations by kind (us) and the contention figures."""
        out: dict[str, Any] = {
            "unprofiled_step_us": self.unprofiled_us,
            "unprofiled_fetch_us": self.unprofiled_fetch_us,
            "profiled_step_us": self.profiled_us,
        }
        if any(self.unprofiled_restart_us):
            out["unprofiled_loader_restart_us"] = self.unprofiled_restart_us
            out["unprofiled_loader_first_fetch_us"] = self.unprofiled_first_fetch_us
            out["unprofiled_loader_restarts"] = self._restarts
        if self.unprofiled_gc_us:
            out["unprofiled_gc_us"] = self.unprofiled_gc_us
            out["unprofiled_full_gc_us"] = self.unprofiled_full_gc_us
            out["unprofiled_gc_collections"] = self._gc_count
            out["gc_longest_pause_us"] = round(self._gc_longest_s * 1e6, 1)
        if any(any(times) for times in self.unprofiled_phase_us.values()):
            out["unprofiled_phase_us"] = self.unprofiled_phase_us
        spent = self._cpu_us
        if spent["fetch_wall"] > 0:  # ~1: the loading computes on one core; ~0: it waits (I/O, sleep)
            out["fetch_cpu_per_wall"] = round(spent["fetch_cpu"] / spent["fetch_wall"], 3)
        if spent["rest_wall"] > 0:
            out["rest_cpu_per_wall"] = round(spent["rest_cpu"] / spent["rest_wall"], 3)
        contention = self.sampler.summary()
        if contention:
            out["contention"] = contention
        return out
