"""Trace-quality rules: say when the trace cannot support a verdict, instead of returning nothing."""

from __future__ import annotations

from typing import Optional

import numpy as np

from torchscope.arrays import median
from torchscope.diagnose.context import Context, as_int
from torchscope.diagnose.rule import WARNING, Threshold, Verdict, rule
from torchscope.report.model import Fix
from torchscope.rundir.contention import OTHERS_BUSY_SHARE

# The profiler schedule that leaves one-time costs out of the window: wait 1, warm up 1, record 3 steps
# (profiler recipe); `torchscope run --wait/--warmup/--active` and `torch.profiler.schedule` take the same.
WAIT = Fix(kind="profiler_option", target="wait", value=1, summary="schedule: skip one step before warming up")
WARMUP = Fix(kind="profiler_option", target="warmup", value=1, summary="schedule: trace one step without recording it")
ACTIVE = Fix(kind="profiler_option", target="active", value=3, summary="schedule: record three steady-state steps")

NO_STEPS = Threshold(0, "no `ProfilerStep#N` marker (profiler recipe: call prof.step() once per iteration)")


@rule(
    "trace_quality.no_steps",
    "trace_quality",
    NO_STEPS,
    severity=WARNING,
    fixes=(
        Fix(kind="code_change", target="Profiler.step", value="prof.step()", summary="mark the end of every training iteration"),
        WAIT,
        WARMUP,
        ACTIVE,
    ),
)
def no_steps(ctx: Context) -> Optional[Verdict]:
    """No step markers: the whole trace, set-up included, is one window."""
    if ctx.report.run.step_source != "whole_trace":
        return None
    return Verdict(
        title="No ProfilerStep markers: the whole trace was analysed as one window",
        share=None,
        evidence={"step_source": "whole_trace"},
        recommendation="Call prof.step() once per iteration (or use `torchscope run`, which does) and use a "
        "schedule with wait/warmup/active so that per-step figures can be compared.",
    )


MIN_STEPS = Threshold(3, "fewer than 3 steps (profiler recipe: profile at least three steady-state steps)")


@rule("trace_quality.few_steps", "trace_quality", MIN_STEPS, severity=WARNING, fixes=(WAIT, WARMUP, ACTIVE))
def few_steps(ctx: Context) -> Optional[Verdict]:
    """Fewer steps than a per-step figure can rest on."""
    if ctx.report.run.step_source == "whole_trace" or ctx.steps >= MIN_STEPS.value:
        return None
    ended = _ended_inside_window(ctx)
    if ended is None and ctx.steps == 0:  # markers, but every step was cut off (steps.find_steps)
        return Verdict(
            title="No complete step captured: the trace's ProfilerStep ranges hold no operator",
            share=None,
            evidence={"steps": 0, "minimum": int(MIN_STEPS.value)},
            recommendation="The profiler stopped right after prof.step() opened a step (the loop ended or broke "
            "while a schedule's cycle was still warming up or recording), so the trace holds no training step. "
            "Analyse the trace files of the cycles that completed, and capture at least 3 steady-state steps: "
            "schedule(wait=1, warmup=1, active=3) or more.",
        )
    if ended is None:
        return Verdict(
            title=f"Only {ctx.steps} step(s) captured: too few for a reliable verdict",
            share=None,
            evidence={"steps": ctx.steps, "minimum": int(MIN_STEPS.value)},
            recommendation="Capture at least 3 steady-state steps: schedule(wait=1, warmup=1, active=3) or more.",
        )
    last_step, first_active, needed, active = ended
    # With --wait 0 --warmup 1 (and no skip) the window starts at step 1: steps 1..last_step are recorded.
    if first_active > 1 and min(last_step, active) >= MIN_STEPS.value:
        earlier = f"or start recording earlier: --skip-first 0 --wait 0 --warmup 1 records steps 1-{min(last_step, active)}"
    else:
        earlier = "since no earlier window holds 3 steps after a warm-up step"
    # A run that failed or was interrupted did not run short by design: that comes first.
    ended_how = {"error": "failed", "interrupted": "was interrupted"}.get(str(ctx.report.run.manifest.get("status")), "ended")
    first = "" if ended_how == "ended" else "Let the run finish (the trace holds the steps before it stopped). "
    return Verdict(
        title=f"Only {ctx.steps} step(s) captured: the run {ended_how} at step {last_step}, inside the profiled window",
        share=None,
        evidence={"steps": ctx.steps, "minimum": int(MIN_STEPS.value), "last_step": last_step, "first_recorded_step": first_active},
        recommendation=f"{first}The schedule records from step {first_active} (steps counted from 0) and needs {needed} "
        f"steps to complete; the run {ended_how} at step {last_step}. Run more iterations ({needed + 1} or more), {earlier}.",
    )


def _ended_inside_window(ctx: Context) -> Optional[tuple[int, int, int, int]]:
    """(last step the capture saw, first recorded step, steps the schedule needs, active steps) when the
    capture's manifest says the run ended before its schedule's first window was complete; None otherwise
    (no manifest, or the window was recorded in full and holds few steps by choice)."""
    manifest = ctx.report.run.manifest
    schedule, seen = manifest.get("schedule"), manifest.get("steps_seen")
    if not isinstance(schedule, dict) or not isinstance(seen, int) or isinstance(seen, bool):
        return None
    try:
        first_active = sum(int(schedule[name]) for name in ("skip_first", "wait", "warmup"))
        active = int(schedule["active"])
    except (KeyError, TypeError, ValueError):
        return None
    # steps_seen counts the step boundaries: the run's last step, counted from 0, has that index.
    needed = first_active + active
    return (seen, first_active, needed, active) if seen < needed else None


WARMUP_STEPS = Threshold(1, "steps 0 or 1 inside the window (profiler recipe: warm up before recording)")


@rule("trace_quality.warmup_in_window", "trace_quality", WARMUP_STEPS, fixes=(WAIT, WARMUP))
def warmup_in_window(ctx: Context) -> Optional[Verdict]:
    """The first training steps, which pay one-time costs, are inside the profiled window."""
    early = sorted({s.step for s in ctx.report.steps if 0 <= s.step <= WARMUP_STEPS.value})
    if not early or ctx.report.run.step_source == "whole_trace":
        return None
    return Verdict(
        title=f"The profiled window includes the first training step(s) {early}",
        share=None,
        evidence={"early_steps": early},
        recommendation="The first steps pay one-time costs (lazy initialisation, allocator growth, cuDNN "
        "autotuning, compilation): profile later steps with schedule(wait=1, warmup=1, active=3) or skip_first.",
    )


OUTLIER_FACTOR = Threshold(1.5, "a step over 1.5x the median step (TRACELENS anomaly threshold)")


# No fix as data: the outliers' cause (GC, checkpointing, a slow batch) is for the timeline to show.
@rule("trace_quality.outlier_steps", "trace_quality", OUTLIER_FACTOR)
def outlier_steps(ctx: Context) -> Optional[Verdict]:
    """Steps far slower than the median, which skew every per-step mean."""
    steps = ctx.report.steps
    durations = np.array([s.duration_us for s in steps])
    if durations.size < MIN_STEPS.value:
        return None
    median_us = median(durations)
    outliers = [s.step for s in steps if s.duration_us > OUTLIER_FACTOR.value * median_us]
    if not outliers:
        return None
    return Verdict(
        title=f"{len(outliers)} step(s) took over {OUTLIER_FACTOR.value}x the median step time",
        share=None,
        evidence={"outlier_steps": outliers[:20], "median_step_us": median_us, "max_step_us": float(durations.max())},
        recommendation="Outliers inflate averages: look at those steps in the timeline (GC, checkpointing, "
        "recompilation, a slow batch) or profile more steps.",
    )


COMPILATION = Threshold(0, "any compilation inside the steps (COMPILE-PROF: compile ids, `(dynamo_timed)` events)")


@rule(
    "trace_quality.compilation_in_window",
    "trace_quality",
    COMPILATION,
    severity=WARNING,
    fixes=(
        Fix(kind="profiler_option", target="skip_first", summary="schedule: start after the steps that compiled"),
        Fix(kind="env_var", target="TORCH_LOGS", value="recompiles", summary="diagnostic: logs why each recompilation happened"),
    ),
)
def compilation_in_window(ctx: Context) -> Optional[Verdict]:
    """torch.compile compiled inside the profiled steps: a first compilation, or a recompilation that does
    not come back step after step (that one is compute.recompiles')."""
    section = ctx.report.measurements.compile
    compile_us = section.compilation_us_per_step
    if steady_recompilation(ctx):
        compile_us -= section.recompilation_us_per_step
    if compile_us <= COMPILATION.value:
        return None
    last_step = max((s.step for s in ctx.report.steps), default=-1)
    numbered = ctx.report.run.step_source == "profiler_step" and last_step >= 0
    return Verdict(
        title="torch.compile compiled code inside the profiled steps",
        share=ctx.share(compile_us),
        evidence={"compilation_us_per_step": compile_us},
        recommendation="Warm up before profiling (schedule(skip_first=..., wait=..., warmup=...)) and avoid "
        "recompilation (mark dynamic dims, keep Python scalars such as the learning rate in tensors).",
        # Start recording after the last step profiled here: the compilations seen here are then behind it.
        fix_values={"skip_first": last_step + 1 if numbered else None},
    )


STEADY_RECOMPILATION = 0.5  # recompiling in at least every other step is no warm-up


def steady_recompilation(ctx: Context) -> bool:
    """Recompilations that keep coming: in at least every other profiled step, and more than one (distinct
    compile ids, over every rank: each rank's own warm-up recompilation is the same id). A single
    recompilation in the window is warm-up (dynamo's automatic dynamic shapes recompile once, then stop)."""
    section = ctx.report.measurements.compile
    return section.recompiling_steps_share >= STEADY_RECOMPILATION and len(section.recompiled_ids) >= 2


NO_DEVICE_EVENTS = Threshold(0, "CUDA in the manifest's activities, no device event in the trace")


# No fix as data: the cause is outside PyTorch (driver/CUPTI, another profiler).
@rule("trace_quality.no_device_events", "trace_quality", NO_DEVICE_EVENTS, severity=WARNING)
def no_device_events(ctx: Context) -> Optional[Verdict]:
    """CUDA activity was requested, yet no kernel, copy or memset was recorded."""
    activities = ctx.report.run.manifest.get("activities") or []
    if "cuda" not in activities or ctx.report.device.present:
        return None
    return Verdict(
        title="CUDA activity was requested but the trace has no GPU events",
        share=None,
        evidence={"activities": activities},
        recommendation="CUPTI could not record kernels (driver/CUPTI mismatch, WSL, or another profiler holding "
        "CUPTI). Check the profiler's warnings at startup; device-side verdicts are not possible.",
    )


PARTIAL = Threshold(0, "an interrupted capture or skipped malformed events")


# No fix as data: re-running the capture to completion is the only change.
@rule("trace_quality.partial", "trace_quality", PARTIAL)
def partial(ctx: Context) -> Optional[Verdict]:
    """The trace is partial: figures cover only what was captured."""
    if not ctx.report.run.partial:
        return None
    return Verdict(
        title="The trace is partial (interrupted capture or malformed events were skipped)",
        share=None,
        evidence={"warnings": ctx.report.warnings[:5], "status": ctx.report.run.manifest.get("status")},
        recommendation="Figures cover only what was captured; re-run the capture to completion for a full picture.",
    )


# -- the profiler's own cost, and a busy machine (issue 13; docs/capture.md) -----------------------------------


MEASURED = ("fetch_clock", "step_clock")  # measurements.profiler_overhead.method when corrected shares exist


def unprofiled_share(ctx: Context, category: str) -> Optional[float]:
    """The breakdown share of `category` without the profiler's overhead: scaled by its phase's corrected
    over recorded share (measurements.profiler_overhead, analysis/overhead.py); None when not measured."""
    section = ctx.report.measurements.profiler_overhead
    corrected = section.corrected_percent.get(category)
    recorded = ctx.report.phases.get(category)
    if section.method not in MEASURED or corrected is None or recorded is None or recorded.percent <= 0:
        return None
    return ctx.breakdown_share(category) * corrected / recorded.percent


def unprofiled_scale(ctx: Context, *phases: str) -> float:
    """How much of the recorded time of `phases` the step has without the profiler: their corrected over
    their recorded share, at most 1 (1 when the capture did not measure it). The Python tracer slows
    Python-heavy phases most (a for-loop or foreach optimizer 2-4x, Python between ops), so a cost read
    off the trace is scaled by it, as the data-loading one is (`unprofiled_share`): the result is a share
    of the unprofiled step (`unprofiled_step_us`)."""
    section = ctx.report.measurements.profiler_overhead
    if section.method not in MEASURED:
        return 1.0
    recorded = sum(ctx.report.phases[name].percent for name in phases if name in ctx.report.phases)
    corrected = sum(section.corrected_percent.get(name, 0.0) for name in phases)
    if recorded <= 0 or corrected <= 0:
        return 1.0
    return min(corrected / recorded, 1.0)


def without_recording(ctx: Context, share: float, *phases: str) -> float:
    """A share of the recorded step that is the fixed cost of operators and the Python between them, as a
    share of the unprofiled step: the profiler's own cost in `phases` (its per-event recording, all of it in
    such time) taken off first, since no fix can save it. Where the capture did not measure the overhead,
    scaled as `phases` are (`unprofiled_scale`)."""
    section = ctx.report.measurements.profiler_overhead
    unprofiled = unprofiled_step_us(ctx)
    if unprofiled is None or not section.overhead_us_by_phase:
        return share * unprofiled_scale(ctx, *phases)
    overhead = sum(section.overhead_us_by_phase.get(name, 0.0) for name in phases)
    return min(max(share * ctx.mean_step_us - overhead, 0.0) / unprofiled, 1.0)


def scaled(cost: tuple[float, tuple[float, float]], scale: float) -> tuple[float, tuple[float, float]]:
    """A finding's (share, (low, high)) times `scale`."""
    share, (low, high) = cost
    return share * scale, (low * scale, high * scale)


def recorded_bounds(ctx: Context, low_us: float, high_us: float, *phases: str) -> tuple[float, float]:
    """(low, high) shares of the step for work the profiler slows by an unknown part: `low_us` scaled as
    its `phases` are (`unprofiled_scale`), `high_us` as recorded over the unprofiled step (the profiler only
    adds time; its recorded share where no unprofiled step was timed), never below the low end."""
    low = min(ctx.share(low_us) * unprofiled_scale(ctx, *phases), 1.0)
    unprofiled = unprofiled_step_us(ctx)
    high = min(high_us / unprofiled, 1.0) if unprofiled else ctx.share(high_us)
    return low, max(high, low)


def unprofiled_step_us(ctx: Context) -> Optional[float]:
    """The step time without the profiler (the capture's clock, median of the unprofiled steps), or None."""
    section = ctx.report.measurements.profiler_overhead
    return section.unprofiled_step_us if section.method in MEASURED and section.unprofiled_step_us > 0 else None


def stated_step_us(ctx: Context) -> float:
    """The step that shares corrected by `unprofiled_share`/`unprofiled_scale` are shares of: the unprofiled
    one where the capture measured it, else the recorded mean."""
    return unprofiled_step_us(ctx) or ctx.mean_step_us


OVERHEAD = Threshold(1.25, "recorded steps over 1.25x the unprofiled ones, or a phase over 1.5x (capture step clock)")
PHASE_SLOWDOWN = 1.5


@rule(
    "trace_quality.profiler_overhead",
    "trace_quality",
    OVERHEAD,
    fixes=(
        Fix(
            kind="profiler_option",
            target="with_stack",
            value=False,
            summary="no Python tracer: little overhead, but no stacks to name culprits (torchscope run --no-stack)",
        ),
    ),
)
def profiler_overhead(ctx: Context) -> Optional[Verdict]:
    """The profiler slowed the steps it recorded, unevenly between phases: the shares the report states
    are corrected for it (analysis/overhead.py); this says by how much."""
    section = ctx.report.measurements.profiler_overhead
    if section.method not in MEASURED or section.unprofiled_step_us <= 0:
        return None
    slowdown = section.profiled_step_us / section.unprofiled_step_us
    # Phases that matter (>= 5 % of the unprofiled step): a tiny phase's ratio is noise.
    phases = {
        name: factor
        for name, factor in section.slowdown_by_phase.items()
        if factor >= 1.05 and section.corrected_percent.get(name, 100.0) >= 5.0
    }
    if slowdown < OVERHEAD.value and not any(f >= PHASE_SLOWDOWN for f in phases.values()):
        return None
    worst = ", ".join(f"{name} {factor:.1f}x" for name, factor in sorted(phases.items(), key=lambda kv: -kv[1])[:3])
    options = ctx.report.run.manifest.get("options")
    stacks = not isinstance(options, dict) or options.get("with_stack") is not False  # unknown: as by default
    return Verdict(
        title=f"The profiler slowed the recorded steps {slowdown:.2f}x" + (f" ({worst})" if worst else ""),
        share=None,
        evidence={
            "unprofiled_step_us": section.unprofiled_step_us,
            "profiled_step_us": section.profiled_step_us,
            "unprofiled_steps": int(section.unprofiled_steps),
            "slowdown_by_phase": section.slowdown_by_phase,
            "recorded_percent": {name: entry.percent for name, entry in ctx.report.phases.items() if entry.percent > 0},
            "corrected_percent": {name: pct for name, pct in section.corrected_percent.items() if pct > 0},
        },
        recommendation=(
            "Recording (above all the Python tracer of with_stack) costs time per recorded event, so Python-heavy "
            "phases ran slower than the rest"
            if stacks
            else "Recording costs time per operator (its shapes and memory events; stacks were off), so phases of "
            "many small operators ran slower than the rest"
        )
        + "; the costs of data loading, the optimizer and Python between operators are stated without that "
        "overhead (capture step clock; docs/capture.md)."
        + (" For timings alone, capture with --no-stack." if stacks else " For timings alone, also --no-shapes --no-memory."),
        fix_targets=None if stacks else (),
    )


BUSY = Threshold(OTHERS_BUSY_SHARE, "other processes used over 25 % of the CPUs this run may use while it was recorded")


@rule(
    "trace_quality.busy_machine",
    "trace_quality",
    BUSY,
    severity=WARNING,
)
def busy_machine(ctx: Context) -> Optional[Verdict]:
    """Other processes competed for the CPUs while the window was recorded: phases that need several cores
    (multi-threaded forward/backward) slow down more than single-threaded ones (Python, data loading), so
    the shares shift and a descheduling can look like a hot spot. Severities are capped at warning."""
    others = busy_share(ctx)
    if others is None:
        return None
    contention = ctx.environment().get("contention") or {}
    cpus = contention.get("cpus")
    slower = 1.0 / max(1.0 - others, 0.05)
    return Verdict(
        title=f"Other processes used {100 * others:.0f} % of the run's {cpus} CPU(s) while it was recorded"
        + (" (beyond the run's other ranks on the node)" if (as_int(ctx.environment().get("local_world_size")) or 1) > 1 else "")
        + ": "
        f"verdicts are capped at warning",
        share=None,
        evidence={
            "other_cpu_share": others,
            "other_cpu_s": contention.get("other_cpu_s"),
            "window_s": contention.get("wall_s"),
            "load_average_1m": contention.get("load_average_1m"),
            "process_cpu_per_wall": contention.get("process_cpu_per_wall"),
            "cpus": cpus,
            "multi_threaded_slowdown_up_to": slower,
        },
        recommendation=f"With {100 * others:.0f} % of the CPUs taken, work that needs every core can run up to "
        f"{slower:.1f}x slower while single-threaded Python barely changes, so the shares (and which phase looks "
        "worst) depend on the load: every finding here is capped at warning. Re-capture on a quiet machine, "
        "or compare runs with `torchscope diff` only when both were equally busy.",
    )


def busy_share(ctx: Context) -> Optional[float]:
    """The share of the run's CPUs other processes used while it was recorded, when at the BUSY threshold.
    The run's other ranks on the node are no other process: they are taken to use what this rank's process
    tree did (`local_world_size - 1` times its CPU), and only the rest counts (a 2-rank gloo run on 2 CPUs
    read "other processes 42 %": the other rank)."""
    contention = ctx.environment().get("contention")
    if not isinstance(contention, dict):
        return None
    others = contention.get("other_share")
    if not isinstance(others, (int, float)) or isinstance(others, bool):
        return None
    siblings = as_int(ctx.environment().get("local_world_size")) or 1
    figures = [contention.get(key) for key in ("own_cpu_s", "other_cpu_s", "wall_s", "cpus")]
    numbers = [float(v) for v in figures if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if siblings > 1 and len(numbers) == len(figures):
        own, other, wall, cpus = numbers
        if wall * cpus > 0:
            others = min(max(other - (siblings - 1) * own, 0.0) / (wall * cpus), others)
    if others < BUSY.value:
        return None
    return float(others)


THINNED = Threshold(0, "any Python-function event dropped at capture to keep a trace within its size budget")


@rule(
    "trace_quality.trace_thinned",
    "trace_quality",
    THINNED,
    fixes=(
        Fix(
            kind="profiler_option",
            target="trace_budget_mb",
            value=0,
            summary="keep every Python call (torchscope run --trace-budget-mb 0; the trace may be hundreds of MB)",
        ),
    ),
)
def trace_thinned(ctx: Context) -> Optional[Verdict]:
    """The capture dropped the shortest Python calls of a trace over its size budget (capture/thinning.py):
    the phases, operators and the kept call tree are whole, but call sites and costly lines shorter than the
    threshold are missing from the stacks. Says how many were dropped."""
    section = ctx.report.measurements.profiler_overhead
    dropped = int(section.python_events_dropped)
    if dropped <= THINNED.value or not section.thinned_traces:
        return None
    recorded = int(section.python_events_recorded)
    threshold = section.kept_python_longer_than_us
    return Verdict(
        title=f"{dropped:,} of {recorded:,} Python calls ({100 * dropped / max(recorded, 1):.0f} %) shorter than "
        f"{threshold:.1f} us were dropped to keep the trace within {section.trace_budget_mb:g} MiB",
        share=None,
        evidence={
            "python_events_recorded": recorded,
            "python_events_dropped": dropped,
            "dropped_python_us": section.dropped_python_us,
            "kept_python_longer_than_us": threshold,
            "trace_budget_mb": section.trace_budget_mb,
            "thinned_traces": section.thinned_traces[:10],
        },
        recommendation="The phase shares, operators and every Python frame longer than the threshold (with "
        "its full inclusive time) are kept, and the dropped calls are still counted in the profiler-overhead "
        "correction; only stacks and costly lines made of shorter calls are missing. To keep them all, "
        "re-capture with --trace-budget-mb 0 (or a larger budget), or with --no-stack for timings alone.",
    )
