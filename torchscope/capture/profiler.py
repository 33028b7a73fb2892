"""``torchscope.profile()``: ``torch.profiler.profile`` with the usual recipe, writing a run directory.

    with torchscope.profile(out="runs") as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
    print(prof.run_dir, prof.trace_files)

Guarantee: the profiler never breaks the training. If the run directory cannot be made, the profiler
does not start, or a trace cannot be written, the problem is printed as one ``torchscope: warning:`` line,
recorded in the manifest's ``errors``, and the training goes on (unprofiled, if need be).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.profiler

from torchscope.capture import conflicts
from torchscope.capture.environment import anomaly_mode_enabled, capture_environment
from torchscope.capture.ignored_warnings import IgnoredWarning
from torchscope.capture.machine import LoaderRegistry
from torchscope.capture.memory_snapshot import SnapshotRecorder
from torchscope.capture.notices import describe, warn_line
from torchscope.capture.overhead import StepClock
from torchscope.capture.phases import PhaseHooks, optimizer_created
from torchscope.capture.quiet import native_stderr_filtered
from torchscope.capture.rundir import DistEnv, choose_run_dir, detect_dist_env, worker_name
from torchscope.capture.signals import DeferredSignals, SigtermSaver
from torchscope.capture.steps import StepDetector, register_marker, unregister_marker
from torchscope.capture.tracewriter import TraceWriter
from torchscope.errors import CaptureError
from torchscope.rundir.config import CaptureConfig
from torchscope.rundir.layout import manifest_name
from torchscope.rundir.manifest import Status, StepMarking, build_manifest, utc_now_iso, write_manifest

_DEFAULT = CaptureConfig()  # the keywords' defaults: declared once, in CaptureConfig


class CaptureComplete(SystemExit):
    """Raised by :meth:`Profiler.step` with ``stop_after_active=True`` once every active window is saved.

    A ``SystemExit`` with code 0, so an unmodified script ends as if it had called ``sys.exit(0)``.
    """

    def __init__(self) -> None:
        super().__init__(0)


class Profiler:
    """Context manager around ``torch.profiler.profile`` that writes a torchscope run directory.

    The first keywords are the fields of :class:`~torchscope.rundir.config.CaptureConfig` (the defaults,
    and why they are what they are, are declared there); :attr:`config` holds them.

    Args:
        out: output folder. If it does not exist it becomes the run directory; otherwise a new
            ``<name>-<YYYYmmdd-HHMMSS>[-N]`` folder is made inside it.
        skip_first, wait, warmup, active, repeat: the ``torch.profiler.schedule`` (steps are counted by
            :meth:`step`). Raises :class:`~torchscope.errors.CaptureError` when invalid.
        record_shapes, profile_memory, with_stack, with_flops: passed to ``torch.profiler.profile``.
        trace_budget_mb: largest trace file in MiB; a larger one loses its shortest Python-function events
            and says so in its header (capture/thinning.py). 0: no bound.
        phase_labels: label forward/backward/optimizer with ``torchscope:*`` ranges (global hooks).
        name: run name used for the run folder (default: the script's name).
        auto_step: detect steps by themselves (optimizer steps, else DataLoader fetches) instead of
            waiting for :meth:`step` calls; used by ``torchscope run``.
        stop_after_active: :meth:`step` raises :class:`CaptureComplete` once the last active window is
            saved (``repeat`` windows, or one if ``repeat`` is 0).
        command: the command line recorded in the manifest (default ``sys.argv``).
        save_on_sigterm: on SIGTERM, save the partial trace and manifest, then die by SIGTERM as usual.
        verbose: keep torch's and Kineto's own log lines about the capture on stderr (capture/quiet.py).
    """

    def __init__(
        self,
        out: str | os.PathLike[str] = _DEFAULT.out,
        *,
        skip_first: int = _DEFAULT.skip_first,
        wait: int = _DEFAULT.wait,
        warmup: int = _DEFAULT.warmup,
        active: int = _DEFAULT.active,
        repeat: int = _DEFAULT.repeat,
        record_shapes: bool = _DEFAULT.record_shapes,
        profile_memory: bool = _DEFAULT.profile_memory,
        with_stack: bool = _DEFAULT.with_stack,
        with_flops: bool = _DEFAULT.with_flops,
        phase_labels: bool = _DEFAULT.phase_labels,
        stop_after_active: bool = _DEFAULT.stop_after_active,
        memory_snapshot: bool = _DEFAULT.memory_snapshot,
        trace_budget_mb: int = _DEFAULT.trace_budget_mb,
        name: str | None = None,
        auto_step: bool = False,
        command: list[str] | None = None,
        save_on_sigterm: bool = True,
        verbose: bool = False,
    ) -> None:
        self.config = CaptureConfig(
            out=out,
            skip_first=skip_first,
            wait=wait,
            warmup=warmup,
            active=active,
            repeat=repeat,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_flops=with_flops,
            phase_labels=phase_labels,
            stop_after_active=stop_after_active,
            memory_snapshot=memory_snapshot,
            trace_budget_mb=trace_budget_mb,
        )
        self.name = name or _default_name()
        self.auto_step = auto_step
        self.command = list(command) if command is not None else list(sys.argv)
        self.save_on_sigterm = save_on_sigterm
        self._quiet = not verbose  # torch's and Kineto's log lines about the capture (capture/quiet.py)

        self.run_dir: Path | None = None
        self.steps_seen = 0
        self.status: Status | None = None
        self.errors: list[str] = []
        self.exit_code: int | None = None
        self.dist = DistEnv()
        self._prof: Any = None  # the torch.profiler.profile while it runs
        self._writer: Any = None
        self._snapshot = SnapshotRecorder(torch, self._problem, warn_line) if memory_snapshot else None
        self._hooks: PhaseHooks | None = None
        self._detector: StepDetector | None = None
        self._clock = StepClock(self.config)  # the profiler's own cost and CPU contention (capture/overhead.py)
        self._loaders = LoaderRegistry()  # the DataLoaders' settings, for advice that fits them
        self._anomaly_seen = False  # autograd's anomaly detection on at a step boundary (a debugging aid left on)
        self._signals = DeferredSignals()
        self._sigterm = SigtermSaver(self._save_on_sigterm)
        self._activities: list[str] = ["cpu"]
        # torch warns when a schedule's second cycle starts that the first cycle's events are cleared and
        # advises acc_events=True: one trace per cycle is what torchscope wants (--repeat), so not shown.
        self._cycle_warning = IgnoredWarning(r"Warning: Profiler clears events at the end of each cycle")
        self._start_time = ""
        self._started = False
        self._closed = False
        self._prof_failed = False  # the torch profiler failed to start or to step
        self._trace_failed = False  # a trace file could not be written
        self._stepped_aside = False  # the program started its own profiler (see step_aside)
        self._chosen_dir = ""  # the run directory as chosen (maybe relative), and the cwd then
        self._start_cwd = ""

    # -- public API ------------------------------------------------------------------------------

    @property
    def trace_files(self) -> list[Path]:
        """Trace files written so far (absolute paths, in the order written)."""
        if self._writer is None or self.run_dir is None:
            return []
        return [self.run_dir / name for name in self._writer.files]

    @property
    def run_dir_text(self) -> str:
        """The run directory as the user named it (relative to where the run started), or absolute when
        the program changed its working directory since."""
        if self.run_dir is None:
            return ""
        try:
            moved = os.getcwd() != self._start_cwd
        except OSError:  # the working directory was removed
            moved = True
        return str(self.run_dir) if moved else self._chosen_dir

    @property
    def recording(self) -> bool:
        """True while the torch profiler is running (started and not stopped or failed)."""
        return self._prof is not None

    @property
    def step_marking(self) -> StepMarking:
        """How steps were marked: ``prof.step()`` calls (``manual``), or what ``auto_step`` found."""
        return self._detector.source if self._detector is not None else "manual"

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(status_for_exception(exc))

    def start(self) -> Profiler:
        """Make the run directory, install the hooks and start the torch profiler."""
        if self._started:
            return self
        self._started = True
        self._start_time = utc_now_iso()
        try:
            self._start()
        except Exception as exc:  # a torchscope bug must not stop the training either
            self._problem(f"could not start profiling: {describe(exc)}; profiling is off for this run")
            self._abandon()
        return self

    def _start(self) -> None:
        self.dist = detect_dist_env()
        try:
            chosen = choose_run_dir(self.config.out, self.name, self.dist)
            self._chosen_dir, self._start_cwd = str(chosen), os.getcwd()
            # Absolute now, before the script runs: its os.chdir must not move the traces.
            self.run_dir = Path(os.path.abspath(chosen))
        except CaptureError as exc:
            self._problem(f"{exc}; profiling is off for this run")
            return
        if self.save_on_sigterm:
            self._sigterm.install()
        with self._signals:
            self._start_profiler()
        if self._prof is not None and (self.config.phase_labels or self.auto_step):
            self._install_hooks()

    def _abandon(self) -> None:
        """Undo whatever part of start() happened; never raises."""
        for undo in (self._uninstall_hooks, self._stop_profiler, self._sigterm.uninstall):
            try:
                undo()
            except Exception:
                pass

    def step(self) -> None:
        """Signal that a training step ended (the next one starts). Never raises, except
        :class:`CaptureComplete` when ``stop_after_active`` is set and the capture is complete."""
        if self._prof is None:
            return
        # The step clock stops before anything of this call and restarts after all of it: ~0.3 ms a step went
        # to the signal guard and the bookkeeping around the clock, which the unprofiled training does not
        # pay, and the clock counted it as the steps' compute (the data share read 2-3 points low).
        self._clock.step_ended()
        self._anomaly_seen = self._anomaly_seen or anomaly_mode_enabled(torch)
        if self.config.repeat > 0 and self.capture_complete:
            # Every window is saved: torch's profiler has nothing left to do until close(). Skipping its step()
            # and the guards around it spares the rest of the run 0.4-0.5 ms a step (5-9 ms on some steps of
            # a busy machine), the unprofiled reference steps included.
            self.steps_seen += 1
            self._retire_after_reference()
            self._clock.step_started()
            return
        self.steps_seen += 1
        with self._signals, conflicts.own_call(self):
            try:
                with native_stderr_filtered(self._quiet):
                    self._prof.step()
            except Exception as exc:
                self._prof_failed = True
                self._problem(f"torch.profiler failed at step {self.steps_seen}: {describe(exc)}; profiling stopped")
                self._stop_profiler()
                if self._hooks is not None:
                    self._hooks.retire()
        if self.capture_complete:
            self._save_snapshot()
            if self.config.stop_after_active:
                raise CaptureComplete()
            self._retire_after_reference()
        self._clock.step_started()

    def _retire_after_reference(self) -> None:
        # Nothing more will be recorded: the rest of the run pays nothing, once the step clock has timed
        # the unprofiled steps that measure the profiler's own cost (capture/overhead.py).
        if self._hooks is not None and self.config.repeat > 0 and not self._clock.wants_reference():
            self._hooks.retire()

    @property
    def capture_complete(self) -> bool:
        """True once the scheduled active windows have ended and were handed to the trace writer
        (``repeat`` windows; the first one when ``repeat`` is 0, i.e. endless)."""
        c = self.config
        cycles = c.repeat or 1
        return self.steps_seen >= c.skip_first + cycles * (c.wait + c.warmup + c.active)

    def close(self, status: Status = "complete", exit_code: int | None = None) -> None:
        """Stop profiling (saving a partial active window), remove the hooks, write the manifest.

        Idempotent; ``status`` is one of ``complete``, ``interrupted``, ``error``, ``stopped``.
        """
        if self._closed:
            return
        self._closed = True
        self.status = status
        self.exit_code = exit_code
        try:
            with self._signals:
                self._uninstall_hooks()  # closes a phase cut short, so its range ends before the trace
                self._stop_profiler()
                self._save_snapshot()
                self._note_missing_trace()
                self._write_manifest()
        except Exception as exc:  # never let the capture's own bookkeeping fail the script
            self._problem(f"could not finish the capture: {describe(exc)}")
        finally:
            # After the deferred block, which restores the handlers it found (ours included).
            self._sigterm.uninstall()

    # -- internals -------------------------------------------------------------------------------

    def _start_profiler(self) -> None:
        assert self.run_dir is not None
        activities = [torch.profiler.ProfilerActivity.CPU]
        try:
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                self._activities = ["cpu", "cuda"]
        except Exception:  # a broken CUDA install must not stop a CPU capture
            pass
        self._writer = TraceWriter(
            self.run_dir, worker_name(self.dist), self._trace_problem, budget_bytes=self.config.trace_budget_mb << 20
        )
        c = self.config
        try:
            prof = torch.profiler.profile(
                activities=activities,
                schedule=torch.profiler.schedule(
                    wait=c.wait, warmup=c.warmup, active=c.active, repeat=c.repeat, skip_first=c.skip_first
                ),
                on_trace_ready=self._writer,
                record_shapes=c.record_shapes,
                profile_memory=c.profile_memory,
                with_stack=c.with_stack,
                with_flops=c.with_flops,
                **_gc_recording(c.with_stack),
            )
            self._cycle_warning.install()
            with conflicts.own_call(self), native_stderr_filtered(self._quiet):
                prof.start()
        except Exception as exc:
            self._cycle_warning.uninstall()
            self._prof_failed = True
            self._problem(f"torch.profiler failed to start: {describe(exc)}; profiling is off for this run")
            return
        self._prof = prof
        self._clock.start()
        self._loaders.install()
        if self._snapshot is not None:
            self._snapshot.start()
        conflicts.activate(self)
        register_marker(self._marker)

    def _save_snapshot(self) -> None:
        """The CUDA memory snapshot beside the trace, once the active window(s) end (`--memory-snapshot`)."""
        if self._snapshot is not None and self.run_dir is not None:
            self._snapshot.save(self.run_dir, worker_name(self.dist))

    def _marker(self) -> None:
        """``torchscope.step()`` in the script: a step, and under ``auto_step`` the end of detection."""
        if self._detector is not None:
            self._detector.on_marker()
        else:
            self.step()

    def _install_hooks(self) -> None:
        if self.auto_step:
            self._detector = StepDetector(self.step, optimizer_created=optimizer_created)
        detector = self._detector
        self._hooks = PhaseHooks(
            labels=self.config.phase_labels,
            on_boundary=detector.on_boundary if detector else None,
            on_optimizer_step=detector.on_optimizer_step if detector else None,
            on_error=self._problem,
            on_phase_time=self._clock.phase_ended,
        )
        try:
            self._hooks.install()
        except Exception as exc:
            self._hooks.uninstall()
            self._hooks = None
            self._problem(f"could not install the phase hooks: {describe(exc)}; phases are not labelled")

    def _uninstall_hooks(self) -> None:
        if self._hooks is not None:
            self._hooks.uninstall()

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        unregister_marker(self._marker)
        self._clock.stop()
        self._loaders.uninstall()
        conflicts.deactivate(self)
        try:
            with conflicts.own_call(self), native_stderr_filtered(self._quiet):
                prof.stop()  # in an active window this exports what was recorded so far (a partial trace)
        except Exception as exc:
            self._problem(f"torch.profiler failed to stop: {describe(exc)}")
        self._cycle_warning.uninstall()

    def step_aside(self) -> None:
        """The program starts a profiler of its own (``torch.profiler.profile``, ``torchscope.profile()``):
        stop recording and remove the hooks, so that one works as under plain python. One warning."""
        if self._prof is None:
            return
        self._stepped_aside = True
        self._problem("the script starts its own profiler; torchscope steps aside (this run records no more)")
        self._stop_profiler()
        if self._hooks is not None:
            self._hooks.retire()

    def _note_missing_trace(self) -> None:
        if self.run_dir is None or self._prof_failed or self.trace_files or self._trace_failed or self._stepped_aside:
            return
        c = self.config
        first_active = c.skip_first + c.wait + c.warmup
        # Held boundaries explain a missing trace only while the optimizer never stepped (once it does, it marks
        # the steps: a run with one update then simply made too few).
        held = self._detector.held if self._detector is not None and self._detector.source != "optimizer" else 0
        if self.auto_step and self.steps_seen == 0 and held:
            self._problem(f"no trace was written: {held} step boundaries (DataLoader fetches or repeated model calls)"
                          " were held for the optimizer the script built, which never stepped; call"
                          " torchscope.step() at the end of each iteration")
            return
        if self.auto_step and self.steps_seen == 0:
            why = (
                "no training steps were detected (no optimizer.step(), DataLoader iteration, backward() or"
                " repeated model call; torchscope.step() marks them)"
            )
        else:
            why = f"the run made {self.steps_seen} step(s) and recording starts at step {first_active}"
        self._problem(f"no trace was written: {why}; lower --skip-first/--wait/--warmup or run more steps")

    def _write_manifest(self) -> None:
        if self.run_dir is None:
            return
        manifest = build_manifest(
            config=self.config,
            step_marking=self.step_marking,
            phase_labels=self.config.phase_labels and self._hooks is not None,
            command=self.command,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            local_rank=self.dist.local_rank,
            start_time=self._start_time,
            activities=self._activities,
            trace_files=[p.name for p in self.trace_files],
            steps_seen=self.steps_seen,
            status=self.status or "complete",
            errors=list(self.errors),
            exit_code=self.exit_code,
            torch_version=str(torch.__version__),
            # The CPU's own peak only after a completed capture (or one --stop-after-active ended once its window
            # was saved): never while saving on a signal or an error.
            environment=capture_environment(
                self._loaders.loaders, self._clock.summary(), self.status in (None, "complete", "stopped"), self._anomaly_seen
            ),
            backend=self._writer.backend if self._writer is not None else None,
        )
        try:
            write_manifest(self.run_dir / manifest_name(self.dist.rank, self.dist.distributed), manifest)
        except OSError as exc:
            self._problem(f"could not write the manifest in {self.run_dir}: {describe(exc)}", record=False)

    def _save_on_sigterm(self) -> None:
        self.close("interrupted")
        if self.run_dir is not None:
            warn_line(f"terminated by SIGTERM; the partial capture is in {self.run_dir}")

    def _trace_problem(self, message: str) -> None:
        # Every later cycle would fail the same way: one line on stderr, every occurrence in the manifest.
        self.errors.append(message)
        if not self._trace_failed:
            warn_line(message)
        self._trace_failed = True

    def _problem(self, message: str, record: bool = True) -> None:
        if record:
            self.errors.append(message)
        warn_line(message)


def _gc_recording(with_stack: bool) -> dict[str, Any]:
    """With stacks, the Python tracer also records each garbage collection ("Python GC" events): a pause
    in the training thread that is otherwise only a gap. Empty where this torch has no such option."""
    if not with_stack:
        return {}
    try:
        return {"experimental_config": torch.profiler._ExperimentalConfig(record_python_gc_info=True)}
    except Exception:  # an older torch: no GC events, nothing else changes
        return {}


def status_for_exception(exc: BaseException | None) -> Status:
    """The manifest status for a capture that ended with ``exc`` (None: normally)."""
    if exc is None:
        return "complete"
    if isinstance(exc, CaptureComplete):
        return "stopped"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, SystemExit):
        return "complete"  # the script chose to exit; its code is the manifest's exit_code
    return "error"


def _default_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return Path(argv0).stem if argv0 else "run"

