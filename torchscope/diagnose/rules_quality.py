"""Trace-quality rule: say when the trace cannot support a verdict, instead of returning nothing."""

from __future__ import annotations

import numpy as np

from torchscope.arrays import median
from torchscope.diagnose.context import Context, finding
from torchscope.report.model import Finding

MIN_STEPS = 3  # profile at least three steady-state steps (profiler recipe)
OUTLIER_FACTOR = 1.5  # TraceLens anomaly threshold: 1.5 x median


def trace_quality(ctx: Context) -> list[Finding]:
    report = ctx.report
    out: list[Finding] = []
    if report.run.step_source == "whole_trace":
        out.append(
            finding(
                id="trace_quality.no_steps",
                category="trace_quality",
                severity="warning",
                title="No ProfilerStep markers: the whole trace was analysed as one window",
                evidence={"step_source": "whole_trace"},
                time_share=None,
                recommendation="Call prof.step() once per iteration (or use `torchscope run`, which does) and use a "
                "schedule with wait/warmup/active so that per-step figures can be compared.",
            )
        )
    elif ctx.steps < MIN_STEPS:
        out.append(
            finding(
                id="trace_quality.few_steps",
                category="trace_quality",
                severity="warning",
                title=f"Only {ctx.steps} step(s) captured: too few for a reliable verdict",
                evidence={"steps": ctx.steps, "minimum": MIN_STEPS},
                time_share=None,
                recommendation="Capture at least 3 steady-state steps: schedule(wait=1, warmup=1, active=3) or more.",
            )
        )
    early = sorted({s.step for s in report.steps if 0 <= s.step <= 1})
    if early and report.run.step_source != "whole_trace":
        out.append(
            finding(
                id="trace_quality.warmup_in_window",
                category="trace_quality",
                severity="info",
                title=f"The profiled window includes the first training step(s) {early}",
                evidence={"early_steps": early},
                time_share=None,
                recommendation="The first steps pay one-time costs (lazy initialisation, allocator growth, cuDNN "
                "autotuning, compilation): profile later steps with schedule(wait=1, warmup=1, active=3) or skip_first.",
            )
        )
    durations = np.array([s.duration_us for s in report.steps])
    if durations.size >= MIN_STEPS:
        median_us = median(durations)
        outliers = [s.step for s in report.steps if s.duration_us > OUTLIER_FACTOR * median_us]
        if outliers:
            out.append(
                finding(
                    id="trace_quality.outlier_steps",
                    category="trace_quality",
                    severity="info",
                    title=f"{len(outliers)} step(s) took over {OUTLIER_FACTOR}x the median step time",
                    evidence={"outlier_steps": outliers[:20], "median_step_us": median_us, "max_step_us": float(durations.max())},
                    time_share=None,
                    recommendation="Outliers inflate averages: look at those steps in the timeline (GC, checkpointing, "
                    "recompilation, a slow batch) or profile more steps.",
                )
            )
    compile_us = float(report.signals.get("compile", {}).get("compilation_us_per_step", 0.0) or 0.0)
    if compile_us > 0:
        out.append(
            finding(
                id="trace_quality.compilation_in_window",
                category="trace_quality",
                severity="warning",
                title="torch.compile compiled code inside the profiled steps",
                evidence={"compilation_us_per_step": compile_us},
                time_share=ctx.share(compile_us),
                recommendation="Warm up before profiling (schedule(skip_first=..., wait=..., warmup=...)) and avoid "
                "recompilation (mark dynamic dims, keep Python scalars such as the learning rate in tensors).",
            )
        )
    activities = report.run.manifest.get("activities") or []
    if "cuda" in activities and not report.device.present:
        out.append(
            finding(
                id="trace_quality.no_device_events",
                category="trace_quality",
                severity="warning",
                title="CUDA activity was requested but the trace has no GPU events",
                evidence={"activities": activities},
                time_share=None,
                recommendation="CUPTI could not record kernels (driver/CUPTI mismatch, WSL, or another profiler holding "
                "CUPTI). Check the profiler's warnings at startup; device-side verdicts are not possible.",
            )
        )
    if report.run.partial:
        out.append(
            finding(
                id="trace_quality.partial",
                category="trace_quality",
                severity="info",
                title="The trace is partial (interrupted capture or malformed events were skipped)",
                evidence={"warnings": report.warnings[:5], "status": report.run.manifest.get("status")},
                time_share=None,
                recommendation="Figures cover only what was captured; re-run the capture to completion for a full picture.",
            )
        )
    return out
