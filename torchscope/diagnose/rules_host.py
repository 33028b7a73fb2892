"""Host-side rules: dispatch/launch overhead, optimizer implementation, work outside the phases,
host-device synchronisation."""

from __future__ import annotations

import re
from typing import Any, Optional

from torchscope.analysis.arithmetic import kept_matmul_us
from torchscope.diagnose.context import Context, ms, pct
from torchscope.diagnose.rule import CRITICAL_SHARE, Severities, Threshold, Verdict, by_share, rule
from torchscope.diagnose.rules_input import COPY_OPS
from torchscope.diagnose.rules_quality import recorded_bounds, scaled, stated_step_us, unprofiled_scale, without_recording
from torchscope.report.measurements import ANOMALY_CHECK, MODULE_HOOK_SYNCS
from torchscope.report.model import Fix, Report

TORCH_COMPILE = Fix(
    kind="code_change",
    target="torch.compile",
    value="model = torch.compile(model)",
    summary="fuse the many small ops into few kernels and trace the Python between them",
)

# TraceLens: a gap whose op self-time covers < 20 % is "CPU untraced" (Python); HTA: launches 5-20 us.
TINY_OPS = Threshold(
    200,
    ">= 200 ops under 30 us per step in forward/backward (I), or with a per-element loop in the model those ops and "
    "the Python between them >= 10 % of the step; warning from 10 % of the step",
)
HOST_OVERHEAD_SHARE = 0.10
RECURRENT_LOOP = 10  # recurrent cell calls per step that make a Python loop over time steps


# The steps already run torch.compile'd code: compiling again is no fix; what is left is outside the graph.
_COMPILED_TEXT = (
    "The model already runs compiled ({regions:.0f} compiled region(s) per step), so this is what the graph "
    "does not hold: graph breaks (list them with TORCH_LOGS=graph_breaks or torch._dynamo.explain), code "
    "around the compiled module, and each compiled call's own guards and wrappers; compile a larger region "
    "(the whole step function) or remove the breaks."
)


def _compiled_regions(ctx: Context) -> float:
    return ctx.report.measurements.compile.compiled_regions_per_step


def _dispatch_evidence(ctx: Context) -> dict[str, Any]:
    dispatch = ctx.report.measurements.dispatch
    return {
        "tiny_ops_per_step": dispatch.tiny_ops_per_step,
        "tiny_op_us_per_step": dispatch.tiny_op_us_per_step,
        "python_gap_us_per_step": dispatch.python_gap_us_per_step,
        "ops_in_forward_backward_per_step": dispatch.ops_per_step,
        "median_op_us": dispatch.median_op_us,
    }


MODEL_CALL_LOOP = 10  # forward passes a step that make a loop of model calls (the matcher's loop threshold)


def calls_model_per_element(ctx: Context) -> bool:
    """Whether a per-element loop calls the model element by element (>= 10 forward passes a step)."""
    patterns, dispatch = ctx.report.measurements.patterns, ctx.report.measurements.dispatch
    return patterns.indexing_loop_iterations_per_step > 0 and dispatch.forward_passes_per_step >= MODEL_CALL_LOOP


def loop_in_model_us(ctx: Context) -> float:
    """The time of the per-element loop (torch's ForLoopIndexingPattern) that batching the model removes:
    all of it where the loop calls the model element by element (>= 10 forward passes a step: the loop's
    `t[i]` runs between the calls), else its part inside forward/backward. A loop in data preparation or
    metrics is not the model's to batch."""
    patterns = ctx.report.measurements.patterns
    return patterns.indexing_loop_us_per_step if calls_model_per_element(ctx) else patterns.indexing_loop_compute_us_per_step


def loop_in_forward_backward(ctx: Context) -> bool:
    """Whether a per-element loop runs in the model (see `loop_in_model_us`)."""
    return loop_in_model_us(ctx) > 0


def batching_applies(ctx: Context) -> bool:
    """Whether `host_overhead.dispatch` speaks for this CPU run: many tiny ops, or a per-element loop in
    the model (`loop_in_model_us`) whose tiny ops and Python between them are a tenth of the step or more
    (a per-sample convnet loop: 186 tiny ops a step, 32 % of it; batching saved 50-64 %)."""
    dispatch = ctx.report.measurements.dispatch
    if ctx.has_device:
        return False
    if dispatch.tiny_ops_per_step >= TINY_OPS.value:
        return True
    return loop_in_forward_backward(ctx) and ctx.share(dispatch.tiny_op_us_per_step + dispatch.python_gap_us_per_step) >= HOST_OVERHEAD_SHARE


def dispatch_saving(ctx: Context) -> Optional[tuple[float, tuple[float, float]]]:
    """The what-if saving of batching the forward/backward (cause `dispatch`: share, (low, high)); None
    where the model did not cover it. Where the trace holds no large matmul to read the machine's rate
    from, its matmul units' kept time is their FLOPs at the rate measured at capture end instead of "all ..
    none of it" (analysis/arithmetic.py)."""
    savings = ctx.report.measurements.savings
    if "dispatch" not in savings.saved_us_per_step_high:
        return None
    low_us, high_us = savings.saved_us_per_step_low.get("dispatch", 0.0), savings.saved_us_per_step_high["dispatch"]
    dispatch = ctx.report.measurements.dispatch
    peak, _ = ctx.cpu_matmul_peak()
    if peak and dispatch.matmul_unrated_us_per_step > 0:  # units of spans without a large one
        unrated_us, unrated_gflop = dispatch.matmul_unrated_us_per_step, dispatch.matmul_unrated_gflop_per_step
        unknown, kept = kept_matmul_us(unrated_us, unrated_gflop, 0.0), kept_matmul_us(unrated_us, unrated_gflop, peak)
        low_us, high_us = low_us + unknown[0] - kept[0], high_us + unknown[1] - kept[1]
    low, high = sorted((ctx.share(low_us), ctx.share(high_us)))
    return (low + high) / 2.0, (low, high)


@rule(
    "host_overhead.dispatch",
    "host_overhead",
    TINY_OPS,
    severity=by_share(HOST_OVERHEAD_SHARE),
    fixes=(TORCH_COMPILE,),
)
def host_overhead_dispatch(ctx: Context) -> Optional[Verdict]:
    """CPU runs: forward/backward made of many tiny ops, each paying dispatch, plus Python between them."""
    dispatch = ctx.report.measurements.dispatch
    if not batching_applies(ctx):
        return None
    measured = ctx.share(dispatch.tiny_op_us_per_step + dispatch.python_gap_us_per_step)
    if loop_in_forward_backward(ctx):
        # A per-element loop (torch's ForLoopIndexingPattern): batching it removes every op's fixed cost
        # and the Python between ops, not the leaf operators' arithmetic (analysis/whatif.py "dispatch").
        share, share_range = dispatch_saving(ctx) or (measured, (measured, measured))
    else:
        # No loop to batch: torch.compile traces the Python between ops away (low) and fuses the tiny ops
        # too (high), but each remaining op keeps its call.
        gaps = ctx.share(dispatch.python_gap_us_per_step)
        share, share_range = (gaps + measured) / 2.0, (gaps, measured)
    # Each recorded op and Python call costs the profiler time. The what-if saving of a loop (every op's fixed
    # cost and the Python between) holds nearly all of it: without the profiler that saving lies between the
    # recorded one less all of that cost (low) and the recorded one scaled as forward and backward are (high).
    # An LSTMCell loop recorded 2x slower read 74-94 %; 53-94 % so; nn.LSTM saved 54 %.
    scale = unprofiled_scale(ctx, "forward", "backward")
    if loop_in_forward_backward(ctx):
        low, high = without_recording(ctx, share_range[0], "forward", "backward"), share_range[1] * scale
        share, share_range = (min(low, high) + high) / 2.0, (min(low, high), high)
    else:  # the Python gaps and tiny ops alone: the profiler's cost is spread over all the phases' events
        share, share_range = scaled((share, share_range), scale)
    measured *= unprofiled_scale(ctx, "forward", "backward")  # what the trace shows, as a share of the unprofiled step
    regions = _compiled_regions(ctx)
    patterns = ctx.report.measurements.patterns
    recurrent = (
        f"It calls a recurrent cell ({patterns.recurrent_cell}) {patterns.recurrent_cells_per_step:.0f} times per step, one "
        "time step at a time: run the whole sequence through nn.LSTM / nn.GRU / nn.RNN instead (one call, its "
        "loop in C++). "
        if patterns.recurrent_cells_per_step >= RECURRENT_LOOP
        else ""
    )
    iterations = patterns.indexing_loop_iterations_per_step
    loop = (
        f"A Python loop in the steps indexes tensors one element at a time ({iterations:.0f} iterations per step): "
        "where each iteration runs the model or a function on t[i], run it once on the whole tensor (fold the "
        "looped dimension into the batch, e.g. model(t.flatten(0, 1))). "
        if loop_in_forward_backward(ctx) and not recurrent
        else ""
    )
    return Verdict(
        title=f"Forward/backward spend {ms(measured * stated_step_us(ctx))} per step on tiny ops and Python between them "
        f"({dispatch.tiny_ops_per_step:.0f} ops under 30 us per step)",
        share=share,
        share_range=share_range,
        evidence={
            **_dispatch_evidence(ctx), "compiled_regions_per_step": regions,
            **({"indexing_loop_iterations_per_step": iterations} if loop_in_forward_backward(ctx) else {}),
        },  # fmt: skip
        recommendation=(
            "The model runs many small operations from Python (e.g. a per-sample or per-element loop). "
            + recurrent
            + loop
            + (
                "Vectorise it into batched tensor ops, or raise the batch size so each op does more work. "
                + _COMPILED_TEXT.format(regions=regions)
                if regions > 0
                else "Vectorise it into batched tensor ops, use torch.compile(model) to fuse the small ops, or "
                "raise the batch size so each op does more work."
            )
        ),
        fix_targets=() if regions > 0 else None,
    )


PYTHON_GAPS = Threshold(0.10, ">= 10 % of the step (TRACELENS: gap time mostly uncovered by op self time is Python, `CPU_UNTRACED`)")
FEW_CPUS = 4  # with this many CPUs or fewer, DataLoader workers compete with the training thread


@rule(
    "host_overhead.python",
    "host_overhead",
    PYTHON_GAPS,
    severity=by_share(PYTHON_GAPS.value),
    fixes=(TORCH_COMPILE,),
)
def host_overhead_python(ctx: Context) -> Optional[Verdict]:
    """CPU runs without many tiny ops: forward/backward time on the main thread covered by no operator."""
    dispatch = ctx.report.measurements.dispatch
    if ctx.has_device or batching_applies(ctx):
        return None  # GPU runs: launch_bound; many tiny ops or a loop of them: host_overhead.dispatch
    # The Python tracer slows exactly this Python: stated without it where the capture measured it.
    share = ctx.share(dispatch.python_gap_us_per_step) * unprofiled_scale(ctx, "forward", "backward")
    if share < PYTHON_GAPS.value:
        return None
    cpus = ctx.environment().get("cpu_count")
    multi = ctx.report.measurements.dataloader.multi_process_fetches > 0
    contention = (
        f" On this machine {cpus} CPU(s) are shared by the training process and its DataLoader workers, so "
        "the training thread may also have been waiting for a core."
        if multi and isinstance(cpus, int) and cpus <= FEW_CPUS
        else ""
    )
    regions = _compiled_regions(ctx)
    return Verdict(
        title=f"Python runs {ms(share * stated_step_us(ctx))} per step inside forward/backward outside any PyTorch operator",
        share=share,
        evidence={**_dispatch_evidence(ctx), "cpu_count": cpus, "compiled_regions_per_step": regions},
        recommendation=(
            "Python code runs between the operators of the forward/backward pass (control flow, data "
            "munging, hooks). Look at the Python frames in the timeline for those gaps, "
            + (
                "and move that work out of the model or into tensor ops. " + _COMPILED_TEXT.format(regions=regions)
                if regions > 0
                else "move that work out of the model or into tensor ops, or let torch.compile trace it."
            )
            + contention
        ),
        fix_targets=() if regions > 0 else None,
    )


LAUNCH_BOUND = Threshold(0.5, "short-kernel fraction >= 50 % and GPU utilisation < 70 % (I: inferred; HTA \"short kernels\")")
LAUNCH_BOUND_UTILIZATION = 0.7


@rule(
    "host_overhead.launch_bound",
    "host_overhead",
    LAUNCH_BOUND,
    severity=by_share(),
    fixes=(
        TORCH_COMPILE,
        Fix(
            kind="code_change",
            target="CUDA graphs",
            value="model = torch.compile(model, mode='reduce-overhead')",
            summary="replay the step's kernels from a CUDA graph: one launch instead of hundreds",
        ),
    ),
)
def host_overhead_launch_bound(ctx: Context) -> Optional[Verdict]:
    """GPU runs: kernels shorter than their launch, and the device idle for reasons other than data
    loading and syncs."""
    if not ctx.has_device or not is_launch_bound(ctx) or launches_block(ctx):
        return None  # blocking launches outlast every kernel: synchronization.launch_blocking's
    unexplained = unexplained_idle_share(ctx)
    if unexplained <= 0:
        return None
    share, share_range = ctx.cost("launch", unexplained)
    launch = ctx.report.measurements.launch
    return Verdict(
        title=f"GPU waits on the host: {pct(launch.short_kernel_fraction)} of kernels are shorter than their launch",
        share=share,
        share_range=share_range,
        evidence={
            "short_kernel_fraction": launch.short_kernel_fraction,
            "kernels_per_step": launch.kernels_per_step,
            "median_kernel_us": launch.median_kernel_us,
            "median_launch_us": launch.median_launch_us,
            "gpu_utilization": ctx.report.device.utilization,
            "device_idle_share": idle_share(ctx),
            "unexplained_idle_share": unexplained,
            "host_ops_during_idle_us_per_step": top_idle_host_ops(ctx),
        },
        recommendation=(
            "Kernels are too small to hide the CPU launch cost. Fuse them with torch.compile(model), capture "
            "the step in CUDA graphs (torch.compile(mode='reduce-overhead')), use foreach/fused optimizers, "
            "or raise the batch size."
        ),
    )


def idle_share(ctx: Context) -> float:
    """Share of the step with no kernel, copy or memset running on the device."""
    return ctx.share(ctx.report.measurements.idle.idle_us_per_step)


def unexplained_idle_share(ctx: Context) -> float:
    """Device idle share of the step during which the host was neither loading data nor blocked in a
    sync (those gaps belong to the data-loading and synchronisation findings)."""
    idle = ctx.report.measurements.idle
    return ctx.share(max(idle.idle_us_per_step - idle.explained_us_per_step, 0.0))


def top_idle_host_ops(ctx: Context, count: int = 5) -> dict[str, float]:
    """The host ops that ran longest while the device idled (largest first, as measured)."""
    return dict(list(ctx.report.measurements.idle.host_ops_us_per_step.items())[:count])


def is_launch_bound(ctx: Context) -> bool:
    """Most kernels are shorter than their launch and the GPU is not kept busy (HTA "short kernels")."""
    utilization = ctx.report.device.utilization
    return (
        ctx.report.measurements.launch.short_kernel_fraction >= LAUNCH_BOUND.value
        and utilization is not None
        and utilization < LAUNCH_BOUND_UTILIZATION
    )


OPTIMIZER = Threshold(
    0.10,
    ">= 10 % of the step, or a for-loop with >= 50 per-parameter ops per step "
    "(I; torch.optim docs: fused > foreach > for-loop)",
)
PER_PARAM_OPS = 50
# Optimizers with a CPU fused kernel (`torch._fused_adam_` / `_fused_adamw_` / `_fused_sgd_` /
# `_fused_adagrad_`), all added in PyTorch 2.4 (pytorch#123074, #123629, #124905); AdamW subclasses Adam.
CPU_FUSED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad"})
CPU_FUSED_SINCE = (2, 4)


@rule(
    "optimizer.step",
    "optimizer",
    OPTIMIZER,
    severity=by_share(OPTIMIZER.value),
    fixes=(
        Fix(
            kind="optimizer_kwarg",
            target="fused",
            value=True,
            summary="one fused kernel updates every parameter (CUDA; CPU for Adam/AdamW/SGD/Adagrad since PyTorch 2.4)",
        ),
        Fix(
            kind="optimizer_kwarg",
            target="foreach",
            value=True,
            summary="multi-tensor ops: a few ops per update term instead of one per parameter",
        ),
    ),
)
def optimizer_step(ctx: Context) -> Optional[Verdict]:
    """The optimizer step is a large share of the step, or runs a per-parameter Python loop."""
    optimizer = ctx.report.measurements.optimizer
    recorded_share = ctx.phase_share("optimizer")
    # A for-loop or foreach step is Python-heavy: the profiler slows it 2-4x, so its share is stated
    # without that overhead where the capture measured it.
    scale = unprofiled_scale(ctx, "optimizer")
    host_share = recorded_share * scale
    # LBFGS's and SparseAdam's own arithmetic is no per-parameter loop that foreach would replace.
    loop = optimizer.implementation == "for_loop" and not _no_multi_tensor(optimizer.optimizers)
    if host_share < OPTIMIZER.value and not (loop and optimizer.per_param_ops_per_step >= PER_PARAM_OPS):
        return None
    targets = _optimizer_fix(optimizer.implementation, ctx.has_device, cpu_fused_supported(ctx.report), optimizer.optimizers)
    # The cost is the first fix's: on a CPU fused and foreach keep different parts of the step.
    cpu_fused = targets[:1] == ("fused",) and not ctx.has_device
    cause = "optimizer_step_fused" if cpu_fused else "optimizer_step"
    share: Optional[float] = None
    share_range: Optional[tuple[float, float]] = None
    if targets:  # nothing to switch to: no saving is claimed (the what-if model prices the switches only)
        share, share_range = scaled(ctx.cost(cause, recorded_share), scale)
    return Verdict(
        title=f"Optimizer step takes {ms(host_share * stated_step_us(ctx))} of host time per step"
        + (f" with a per-parameter loop ({optimizer.per_param_ops_per_step:.0f} small ops per step)" if loop else "")
        + (
            ""
            if targets
            else f" ({pct(host_share)} of the step); {', '.join(optimizer.optimizers)} has no foreach or fused implementation"
            if _no_multi_tensor(optimizer.optimizers)
            else f" ({pct(host_share)} of the step) with the {optimizer.implementation} implementation"
        ),
        share=share,
        share_range=share_range,
        evidence={
            "optimizer_us_per_step": host_share * stated_step_us(ctx),
            "recorded_optimizer_us_per_step": recorded_share * ctx.mean_step_us,
            "optimizers": optimizer.optimizers,
            "implementation": optimizer.implementation,
            "per_param_ops_per_step": optimizer.per_param_ops_per_step,
            "foreach_ops_per_step": optimizer.foreach_ops_per_step,
            "fused_ops_per_step": optimizer.fused_ops_per_step,
        },
        recommendation=_optimizer_text(optimizer.optimizers, optimizer.implementation, targets),
        fix_targets=targets,
    )


def cpu_fused_supported(report: Report) -> Optional[bool]:
    """Whether every optimizer in the steps has a CPU fused kernel in the captured torch (None: the
    torch version is not recorded, e.g. a trace captured without torchscope)."""
    match = re.match(r"(\d+)\.(\d+)", str(report.run.manifest.get("torch_version", "")))
    if match is None:
        return None
    names = report.measurements.optimizer.optimizers
    return (int(match[1]), int(match[2])) >= CPU_FUSED_SINCE and bool(names) and set(names) <= CPU_FUSED_OPTIMIZERS


def _optimizer_fix(implementation: str, has_device: bool, cpu_fused: Optional[bool], names: list[str]) -> tuple[str, ...]:
    """In order of preference. GPU: fused. CPU: a for-loop gets fused (then foreach) where this torch has
    the optimizer's CPU kernel (it removes 75-85 % of the step's optimizer time against foreach's 30-60 %,
    docs/rules.md), else foreach; foreach gets fused unless known unsupported. Already fused, or torch.optim
    classes with neither implementation (LBFGS, SparseAdam): nothing."""
    if implementation == "fused" or _no_multi_tensor(names):
        return ()
    if has_device:
        return ("fused",)
    if implementation == "foreach":
        return () if cpu_fused is False else ("fused",)
    return ("fused", "foreach") if cpu_fused else ("foreach",)


# torch.optim's classes (the names in `Optimizer.step#<Class>.step`); another name is a wrapper or a
# library's optimizer (NeMo's EMAOptimizer), whose inner torch.optim optimizer takes the keyword.
TORCH_OPTIMIZERS = frozenset(
    {"Adadelta", "Adafactor", "Adagrad", "Adam", "Adamax", "AdamW", "ASGD", "LBFGS", "NAdam", "RAdam", "RMSprop",
     "Rprop", "SGD", "SparseAdam"}
)  # fmt: skip


# torch.optim classes without a foreach or fused implementation: their `step` is its own algorithm.
SINGLE_TENSOR_OPTIMIZERS = frozenset({"LBFGS", "SparseAdam"})


def _no_multi_tensor(names: list[str]) -> bool:
    """Every optimizer seen is a torch.optim class without foreach or fused (a wrapper's inner one may have them)."""
    return bool(names) and all(name in SINGLE_TENSOR_OPTIMIZERS for name in names)


def _with_keyword(name: str, keyword: str) -> str:
    """`torch.optim.SGD(..., fused=True)`, or the same keyword on the optimizer a wrapper holds."""
    if name in TORCH_OPTIMIZERS:
        return f"torch.optim.{name}(..., {keyword})"
    return f"{keyword} on the torch.optim optimizer {name} wraps"


def _optimizer_text(names: list[str], implementation: str, targets: tuple[str, ...]) -> str:
    """The advice for the first of `targets` (see `_optimizer_fix`); with none, what is left to try."""
    name = names[0] if names else "Adam"
    if implementation == "for_loop" and targets[:1] == ("fused",) and "foreach" in targets:
        return (
            f"Use the fused implementation: {_with_keyword(name, 'fused=True')} updates each parameter in one "
            "pass from a single C++ call (this PyTorch has the CPU kernel), instead of one op per parameter per "
            "update term; foreach=True is the fallback."
        )
    if implementation == "for_loop" and targets == ("foreach",):
        return (
            f"Use the multi-tensor implementation: {_with_keyword(name, 'foreach=True')}, or fused=True (CUDA; CPU "
            "for Adam/AdamW/SGD in recent PyTorch), which updates all parameters in a few kernels instead of one "
            "op per parameter per update term."
        )
    if targets[:1] == ("fused",):
        return (
            f"Use the fused implementation: {_with_keyword(name, 'fused=True')} runs the whole update of the "
            "parameters in one kernel per group instead of "
            + ("one op per parameter per update term." if implementation == "for_loop" else "one multi-tensor op per update term.")
        )
    already = {"fused": "already runs fused", "foreach": "already runs foreach (this PyTorch has no fused CPU kernel for it)"}
    state = already.get(implementation, "itself")
    if _no_multi_tensor(names):
        state = f"({', '.join(names)}) has no foreach or fused implementation"
    return (
        f"The optimizer {state} and is a large share of the step: a cheaper "
        "optimizer (SGD with momentum, or a factored one such as Adafactor for large embeddings), fewer parameter "
        "groups, or, across ranks, ZeroRedundancyOptimizer / FSDP to shard its work."
    )


ZERO_FILL = Threshold(0, "any fill op inside zero_grad (I; tuning guide: set_to_none saves memory traffic)")


@rule(
    "optimizer.zero_grad_fill",
    "optimizer",
    ZERO_FILL,
    fixes=(
        Fix(
            kind="code_change",
            target="optimizer.zero_grad",
            value="optimizer.zero_grad(set_to_none=True)",
            summary="free the gradients instead of writing zeros into them",
        ),
    ),
)
def optimizer_zero_grad_fill(ctx: Context) -> Optional[Verdict]:
    """zero_grad writes zeros into every gradient (set_to_none=False) instead of dropping them."""
    optimizer = ctx.report.measurements.optimizer
    fills = optimizer.zero_grad_fill_ops_per_step
    if fills <= ZERO_FILL.value:
        return None
    scale = unprofiled_scale(ctx, "optimizer")  # zero_grad is in the optimizer phase
    share, share_range = scaled(ctx.cost("zero_grad", ctx.share(optimizer.zero_grad_us_per_step)), scale)
    zero_us = optimizer.zero_grad_us_per_step
    if scale < 1.0:  # the unprofiled step's microseconds, as the share
        zero_us = ctx.share(zero_us) * scale * stated_step_us(ctx)
    return Verdict(
        title=f"zero_grad fills gradients with zeros ({fills:.0f} fill ops per step, {ms(zero_us)})",
        share=share,
        share_range=share_range,
        evidence={"zero_fill_ops_per_step": fills, "zero_grad_us_per_step": zero_us},
        recommendation="Call optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0): it frees "
        "gradients instead of writing zeros, saving memory traffic.",
    )


DENSE_EMBEDDING = Threshold(
    0.05,
    "a table of >= 1M values with dense gradients, its lookups per step under 10 % of its rows, and the work on "
    "the whole table outside the forward >= 5 % of the step (I; torch.nn.Embedding docs: sparse gradients)",
)
SPARSE_ROWS = 0.10  # lookups per step under this share of a table's rows: most of a dense update is untouched rows


@rule(
    "optimizer.dense_embedding",
    "optimizer",
    DENSE_EMBEDDING,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="nn.Embedding",
            value="nn.Embedding(num_embeddings, embedding_dim, sparse=True)",
            summary="a gradient of the looked-up rows only (nn.EmbeddingBag takes sparse=True too)",
        ),
        Fix(
            kind="code_change",
            target="torch.optim.SparseAdam",
            value="torch.optim.SparseAdam(list(embedding.parameters()))",
            summary="updates only the rows in the sparse gradient; the other parameters in a second optimizer",
        ),
    ),
)
def optimizer_dense_embedding(ctx: Context) -> Optional[Verdict]:
    """A large embedding table trained with dense gradients: each step updates every row for a few lookups."""
    section = ctx.report.measurements.embeddings
    us = section.dense_update_us_per_step
    sparse_use = {t: section.lookups_per_step.get(t, 0.0) / int(t.split("x")[0]) for t in section.dense_tables if t.split("x")[0].isdigit()}
    few = {t: share for t, share in sparse_use.items() if share < SPARSE_ROWS}
    if not few or us <= 0:
        return None
    # The backward's dense gradient, zero_grad and the optimizer: slowed as those phases are by the profiler.
    low, high = recorded_bounds(ctx, us, us, "backward", "optimizer")
    if high < DENSE_EMBEDDING.value:
        return None
    table = max(few, key=lambda t: int(t.split("x")[0]))
    rows = int(table.split("x")[0])
    lookups = section.lookups_per_step.get(table, 0.0)
    where = " of GPU time" if section.time_base == "device" else ""
    return Verdict(
        title=f"The {table} embedding table is updated whole every step for {lookups:,.0f} lookups "
        f"(at most {pct(lookups / rows)} of its rows): {ms(us)}{where} per step on dense gradients",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "dense_tables": section.dense_tables,
            "lookups_per_step": section.lookups_per_step,
            "dense_update_us_per_step": us,
        },
        recommendation=(
            f"nn.Embedding (sparse=False, the default) backpropagates a gradient as large as its table, zero_grad "
            f"clears it and the optimizer updates all {rows:,} rows (Adam: several passes over the table and its two "
            "moments), though the step reads only its batch's rows. With nn.Embedding(..., sparse=True) (or "
            "nn.EmbeddingBag(..., sparse=True)) the gradient holds only the rows looked up, and torch.optim.SparseAdam "
            "(or SGD, Adagrad) updates only those; give the other parameters a second optimizer (a 1,000,000x64 "
            "table with 2,048 lookups a step, Adam on a CPU: 360 ms steps dense, 3.9 ms sparse). The update becomes "
            "lazy: rows not looked up keep their moments and get no weight decay (SparseAdam has none), which "
            "recommendation models usually want. Under DDP, sparse gradients need a backend that reduces them (gloo). "
            "A fused or foreach optimizer (optimizer.step) makes the same passes faster (that model: 364 ms for-loop, "
            "103 ms fused), but only sparse gradients skip them."
        ),
    )


OUTSIDE = Threshold(0.05, ">= 5 % of the step (I)")
HINT_SHARE = 0.10  # a culprit's part of the explained time for its hint to be given (and to be in the title)
LISTED_SHARE = 0.01  # ... for it to be listed in the evidence
# The words of a culprit's function (`_maybe_log_save_evaluate (trainer.py:2238)`: maybe, log, save,
# evaluate; `Tensor.item`: tensor, item), not substrings: `compute_logits` is not logging, and the file
# only where it says what the call does (`serialization.py`): torch._dynamo's `eval_frame.py` is no evaluation.
_CHECKPOINT_WORDS = frozenset({"save", "checkpoint", "checkpointing"})
_CHECKPOINT_FILES = frozenset({"serialization", "pickle"})
_LOGGING_WORDS = frozenset({"item", "tolist", "print", "log", "logging", "logger", "metric", "metrics", "wandb", "tensorboard"})
_EVAL_WORDS = frozenset({"eval", "evaluate", "evaluation", "valid", "validate", "validation", "val"})
_READABLE_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(\.py)?:\d+\)$")
_CHECKPOINT_HINT = "write checkpoints every N steps (or from a background thread / torch.distributed.checkpoint async_save)"
_LOGGING_HINT = "log metrics every N steps and avoid .item()/.cpu() on each step"
_EVAL_HINT = "run evaluation every N steps, not inside every step"
# An exponential moving average of the weights (`ema_update`, timm's ModelEmaV2, AveragedModel): a loop of
# two tiny ops per parameter, every step.
_EMA_WORDS = frozenset({"ema", "swa", "polyak", "averaged"})  # not "average": DDP tutorials' average_gradients
_EMA_HINT = (
    "update the weights' moving average with one multi-tensor op per step (torch._foreach_lerp_(ema_params, "
    "params, 1 - decay), or torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay))) "
    "rather than a loop over parameters, or every N steps"
)
# A model call outside the phases: the capture leaves a module call without gradients unlabelled once the
# run has trained (capture/phases.py NO_GRAD_FORWARD).
_NO_GRAD_MODEL_HINT = (
    "a model call without gradients inside the step (validation, metrics, an EMA or teacher model): if it is "
    "evaluation, run it every N steps; if it must run every step, run it under torch.inference_mode() and in "
    "bfloat16 (torch.autocast)"
)


# Work that runs in at most this share of the recorded steps (and in 3 steps or more) is periodic: an
# evaluation or a checkpoint every N steps, which the loop already keeps out of most steps.
PERIODIC_STEPS_SHARE = 0.5
PERIODIC_MIN_STEPS = 3
_PERIODIC_TEXT = (
    "{name} runs in {share} of the recorded steps ({each} each time, {per_step} per step on average): work the "
    "loop already runs every few steps, whose cost falls with a longer interval (twice the interval halves it){extra}."
)
_PERIODIC_EVAL_EXTRA = "; the evaluation itself is cheaper under torch.inference_mode() with larger batches"
_PERIODIC_CHECKPOINT_EXTRA = "; or save in the background (torch.distributed.checkpoint.async_save)"


def _periodic_advice(name: str, us_per_step: float, steps_share: float) -> str:
    words, file = _words(name)
    extra = ""
    if words & _EVAL_WORDS or name.lower().startswith("nn.module: "):
        extra = _PERIODIC_EVAL_EXTRA
    elif words & _CHECKPOINT_WORDS or file in _CHECKPOINT_FILES:
        extra = _PERIODIC_CHECKPOINT_EXTRA
    return _PERIODIC_TEXT.format(name=name, share=pct(steps_share), each=ms(us_per_step / steps_share),
                                 per_step=ms(us_per_step), extra=extra)


def _words(name: str) -> tuple[frozenset[str], str]:
    """The words of a readable culprit name's function (split on anything not a letter or digit, lower
    case) and its file's stem (empty when not a frame)."""
    lower = name.lower()
    match = _READABLE_FRAME.match(lower)
    func, file = (match["func"], match["file"].rsplit("/", 1)[-1]) if match else (lower, "")
    return frozenset(w for w in re.split(r"[^a-z0-9]+", func) if w), file


def _culprit_hints(names: list[str]) -> list[str]:
    """The hints whose words one of `names` (readable culprit names) has, in a fixed order."""
    found: set[str] = set()
    for name in names:
        lower = name.lower()
        words, file = _words(name)
        if words & _CHECKPOINT_WORDS or file in _CHECKPOINT_FILES:
            found.add(_CHECKPOINT_HINT)
        if words & _LOGGING_WORDS or "local_scalar_dense" in lower or "add_scalar" in lower:
            found.add(_LOGGING_HINT)
        if words & _EVAL_WORDS:
            found.add(_EVAL_HINT)
        if words & _EMA_WORDS or "emav" in lower:
            found.add(_EMA_HINT)
        if lower.startswith("nn.module: "):
            found.add(_NO_GRAD_MODEL_HINT)
    return [hint for hint in (_CHECKPOINT_HINT, _LOGGING_HINT, _EVAL_HINT, _EMA_HINT, _NO_GRAD_MODEL_HINT) if hint in found]


def _is_grad_clipping(name: str) -> bool:
    """`clip_grad_norm_`, Hugging Face's `_clip_grad_norm`, `clip_grad_value_`: work every step needs."""
    words, _ = _words(name)
    return "clip" in words and bool(words & {"grad", "grads", "gradient", "gradients", "norm"})


# A function named after the batches it makes (`get_batch`, a `batches()` generator the loop iterates with
# `for`, which PyTorch records as the generator's frame, no `next()` call): the loop's own batch source.
_BATCH_WORDS = frozenset({"batch", "batches", "data", "dataset", "loader", "dataloader", "fetch", "prefetch", "sample", "samples", "collate"})
_BATCH_SOURCE_TEXT = (
    "{name} looks like the loop's batch source: data loading the step waits for, not work to run less often. "
    "Load ahead of the step: a DataLoader with num_workers (an IterableDataset can wrap a generator), or a "
    "background thread that fills a queue; on a GPU, pin the batches and copy them with non_blocking=True."
)


def _is_event_hook(name: str) -> bool:
    """A framework callback named for the event it handles (Lightning's `on_batch_end`,
    `_on_before_batch_transfer`, Hugging Face's `on_step_end`): it runs at a batch, it does not make one."""
    match = _READABLE_FRAME.match(name.lower())
    return (match["func"] if match else name.lower()).rsplit(".", 1)[-1].lstrip("_").startswith("on_")


def _is_batch_source(name: str) -> bool:
    if _is_event_hook(name):
        return False
    words, file = _words(name)
    # A tokenizer's other calls (`batch_decode` of predictions for a log) are no batch source.
    return bool(words & _BATCH_WORDS) and not (
        words & _CHECKPOINT_WORDS or file in _CHECKPOINT_FILES or words & _EVAL_WORDS or "tokeniz" in file
    )


# A tokenizer called in the loop (`__call__ (tokenization_utils_base.py:2458)`, `encode_batch`, a `tokenize`
# function of the user's): per-batch data preparation, which runs every step however rarely anything else does.
_TOKENIZE_TEXT = (
    "{name} tokenizes text inside the step: data preparation the step waits for, every step. Tokenize the "
    "dataset once ahead of training (Hugging Face datasets' map(tokenize, batched=True), or token ids cached "
    "to disk), or in the DataLoader's worker processes (in the Dataset's __getitem__ or a collate_fn, with "
    "num_workers > 0)."
)


_ENCODING_CALLS = re.compile(r"^(__call__|_?call_one|(_?batch_)?encode\w*|_?tokenize\w*|encode_batch\w*)$")


def _is_tokenization(name: str) -> bool:
    """A tokenizer's encoding call: an encode-side function (`__call__`, `encode*`, `batch_encode*`,
    `tokenize`) in a tokenizer library's file, or a function of the user's named after tokenizing. Not the
    file alone (a `train_tokenized.py` script's evaluate), nor a tokenizer's decode or save."""
    match = _READABLE_FRAME.match(name.lower())
    func, file = (match["func"], match["file"]) if match else (name.lower(), "")
    method = func.rsplit(".", 1)[-1]
    return method.startswith("tokeniz") or ("tokeniz" in file and _ENCODING_CALLS.match(method) is not None)


_CLIP_TEXT = (
    "Gradient clipping ({name}) belongs to every step and is not work to move: it computes the gradients' norm "
    "in fewer ops with foreach=True (torch.nn.utils.clip_grad_norm_(..., foreach=True)), and under FSDP with "
    "the wrapped model's own clip_grad_norm_."
)
# foreach is clip_grad_norm_'s default wherever the gradients' device has the kernels: advising it then is no
# change. On a CPU those kernels still run a norm and a scaling per tensor (measured: no faster than foreach=False).
_CLIP_FOREACH_TEXT = (
    "Gradient clipping ({name}) belongs to every step and is not work to move. It already takes the multi-tensor "
    "path (aten::_foreach_norm runs inside it){cpu}. Under FSDP, use the wrapped model's own clip_grad_norm_."
)
_CLIP_CPU = (
    ", and on a CPU the foreach kernels still run one norm and one scaling per gradient tensor: its time grows "
    "with the number of parameter tensors as well as with their size"
)


# A training framework's own per-step work (analysis/frames.py, TRAINING_FRAMEWORKS): what its user can turn.
_FRAMEWORK_NAMES = {"lightning": "Lightning", "pytorch_lightning": "Lightning", "lightning_fabric": "Lightning Fabric",
                    "transformers": "the Hugging Face Trainer", "trl": "the TRL trainer", "accelerate": "Accelerate"}  # fmt: skip
_LIGHTNING_TIPS = (
    "log less often (Trainer(log_every_n_steps=...), self.log(..., on_step=False) for epoch-level figures) and drop "
    "the callbacks and the progress bar you do not need (enable_progress_bar=False)"
)
_HF_TIPS = "log less often (TrainingArguments(logging_steps=...)) and turn the progress bar off (disable_tqdm=True)"
_FRAMEWORK_TIPS = {"lightning": _LIGHTNING_TIPS, "pytorch_lightning": _LIGHTNING_TIPS, "lightning_fabric": _LIGHTNING_TIPS,
                   "transformers": _HF_TIPS, "trl": _HF_TIPS}  # fmt: skip
_FRAMEWORK_TEXT = (
    "{us} of it is {framework}'s own per-step work (its hooks, logging and bookkeeping: {names}), a fixed cost per "
    "step that more work per step (a larger batch) makes a smaller share{tips}."
)


def _framework_advice(ctx: Context, explained_us: float, kept: set[str]) -> tuple[str, set[str]]:
    """The advice on a training framework's own share of the time outside the phases, when it is most of
    what can move (`kept`: the culprits that belong to every step or have advice of their own, gradient
    clipping, tokenizing, the batch source), and that framework's culprits (no "move this work" for code
    the user does not own)."""
    section = ctx.report.measurements.outside_steps
    framework, us = next(iter(section.framework_us_per_step.items()), ("", 0.0))
    owned = {}
    for entry in section.framework_culprits:
        owner, _, name = entry.partition(": ")
        owned[name] = owner
    mine = [name for name, owner in owned.items() if owner == framework]
    culprits = section.culprits_us_per_step
    us -= sum(culprits.get(name, 0.0) for name in mine if name in kept)
    movable_us = explained_us - sum(us_ for name, us_ in culprits.items() if name in kept)
    us = min(us, movable_us)  # counted over all culprits; the time explained is capped by the step's 'other'
    if not framework or us <= 0 or us < 0.5 * movable_us:
        return "", set()
    names = [name for name in culprits if name in mine and name not in kept][:3]
    tips = _FRAMEWORK_TIPS.get(framework)
    text = _FRAMEWORK_TEXT.format(us=ms(us), framework=_FRAMEWORK_NAMES.get(framework, framework), names=", ".join(names),
                                  tips=f"; {tips}" if tips else "")  # fmt: skip
    return text, set(mine)


# No fix as data: the work differs from run to run; the recommendation names it after its culprits.
@rule("outside_steps.work", "outside_steps", OUTSIDE, severity=by_share(OUTSIDE.value))
def outside_steps_work(ctx: Context) -> Optional[Verdict]:
    """Step time in no phase, as far as the named culprits (outermost ops, ranges, frames) explain it."""
    culprits = ctx.report.measurements.outside_steps.culprits_us_per_step
    other_us = ctx.phase_share("other") * ctx.mean_step_us
    explained_us = min(sum(culprits.values()), other_us)
    explained = ctx.share(explained_us)  # only what the named culprits account for
    if explained < OUTSIDE.value or not culprits:
        return None
    # The what-if saving counts all main-thread work outside the phases: keep it to what the culprits explain,
    # less gradient clipping, which every step needs (a Hugging Face Trainer's: 1.1 of its 3.1 ms).
    clipping_us = sum(us for name, us in culprits.items() if _is_grad_clipping(name))
    movable_share = ctx.share(max(explained_us - clipping_us, 0.0))
    modelled, (low, high) = ctx.cost("outside_steps", explained)
    share: Optional[float] = min(modelled, movable_share)
    share_range: Optional[tuple[float, float]] = (min(low, movable_share), min(high, movable_share))
    # Named (evidence) from a hundredth of the explained time, the first always: a 4 us `_get_tracing_state`
    # beside a 15 ms generator is noise.
    top = {name: us for i, (name, us) in enumerate(list(culprits.items())[:5]) if i == 0 or us >= LISTED_SHARE * explained_us}
    # Advice for the culprits that matter: a 13 us .item() beside a 3 ms sleep is not why the step is slow.
    weighty = [name for name, us in top.items() if us >= HINT_SHARE * explained_us]
    clipping = [name for name in weighty if _is_grad_clipping(name)]
    tokenizing = [name for name in weighty if name not in clipping and _is_tokenization(name)]
    sources = [name for name in weighty if name not in clipping + tokenizing and _is_batch_source(name)]
    framework_text, framework_culprits = _framework_advice(ctx, explained_us, set(clipping + tokenizing + sources))
    movable = [name for name in weighty if name not in clipping + tokenizing + sources]
    owned = [name for name in movable if name not in framework_culprits]  # the user's own, or another library's
    # Periodic work (an evaluation every N steps) gets its own advice: "run it every N steps" it already does.
    steps_share = ctx.report.measurements.outside_steps.culprit_steps_share
    periodic = [name for name in owned if ctx.steps >= PERIODIC_MIN_STEPS and 0 < steps_share.get(name, 1.0) <= PERIODIC_STEPS_SHARE]
    movable = [name for name in movable if name not in periodic]
    owned = [name for name in owned if name not in periodic]
    periodic_us = sum(culprits[name] for name in periodic)
    foreach_clipping = bool(clipping) and clipping[0] in ctx.report.measurements.outside_steps.foreach_norm_culprits
    if movable_share < OUTSIDE.value and not (movable or tokenizing or sources or periodic):  # gradient clipping and noise
        if not clipping or foreach_clipping:
            return None  # nothing to move, nothing to switch
        share, share_range = None, None  # a switch to foreach norms: its saving is not modelled
    hints = _culprit_hints(owned if framework_text else movable)
    model_us = ctx.report.measurements.outside_steps.model_calls_us_per_step
    every_step_model_us = model_us - periodic_us  # model calls inside periodic work are its own (an evaluation)
    if every_step_model_us >= HINT_SHARE * explained_us and _NO_GRAD_MODEL_HINT not in hints:  # a model call under the culprits
        hints.append(_NO_GRAD_MODEL_HINT)
    advice = [_periodic_advice(name, culprits[name], steps_share[name]) for name in periodic]
    if framework_text:
        advice.append(framework_text)
    if hints or (owned if framework_text else movable) or not (clipping or sources or tokenizing or framework_text or periodic):
        advice.append("Move this work out of the per-step path: "
                      + ("; ".join(hints) if hints else "run it every N steps or in a background thread") + ".")
    if tokenizing:
        advice.append(_TOKENIZE_TEXT.format(name=tokenizing[0]))
    if sources:
        advice.append(_BATCH_SOURCE_TEXT.format(name=sources[0]))
    if clipping:
        if foreach_clipping:
            advice.append(_CLIP_FOREACH_TEXT.format(name=clipping[0], cpu="" if ctx.has_device else _CLIP_CPU))
        else:
            advice.append(_CLIP_TEXT.format(name=clipping[0]))
    if periodic and share is not None and share_range is not None:
        # Doubling the interval of the periodic work saves half of it: the low end of the saving.
        share_range = (max(share_range[0] - ctx.share(periodic_us) / 2, 0.0), share_range[1])
    named = list(top)[:1] + [name for name in list(top)[1:2] if top[name] >= HINT_SHARE * explained_us]
    return Verdict(
        title=f"{ms(explained_us)} of each step runs outside data loading/forward/backward/optimizer, mostly in "
        + ", ".join(f"{name} (in {pct(steps_share[name])} of the steps)" if name in periodic else name for name in named),
        share=share,
        share_range=share_range,
        evidence={
            "outside_us_per_step": explained_us,
            "unattributed_other_us_per_step": max(other_us - explained_us, 0.0),
            "culprits_us_per_step": top,
            **({"model_calls_us_per_step": model_us} if model_us > 0 else {}),
            **({"periodic_culprits_steps_share": {name: steps_share[name] for name in periodic}} if periodic else {}),
        },
        recommendation=" ".join(advice),
    )


MODULE_HOOKS = Threshold(0.05, ">= 5 % of the step in hooks the user's code registered on modules (I; recorded stacks)")


@rule(
    "host_overhead.module_hooks",
    "host_overhead",
    MODULE_HOOKS,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="nn.Module.register_forward_hook",
            value="if step % 100 == 0: ...  # inside the hook, or handle.remove() when not needed",
            summary="run the hook's work every N steps, or remove it (handle.remove()) while it is not needed",
        ),
    ),
)
def host_overhead_module_hooks(ctx: Context) -> Optional[Verdict]:
    """Hooks registered on modules run at every module call of every step."""
    hooks = ctx.report.measurements.module_hooks
    if hooks.calls_per_step <= 0:
        return None
    # The hooks run inside forward (or backward): scaled as those phases are by the profiler, up to their
    # recorded time over the unprofiled step.
    low, high = recorded_bounds(ctx, hooks.hooks_us_per_step, hooks.hooks_us_per_step, "forward", "backward")
    if high < MODULE_HOOKS.value:
        return None
    names = list(hooks.hooks_us_by_name)
    sync = " On a GPU each .item() or .cpu() in a hook waits for the device." if ctx.has_device else ""
    return Verdict(
        title=f"Module hooks run {hooks.calls_per_step:.0f} times per step ({ms(hooks.hooks_us_per_step)} recorded), "
        f"mostly in {names[0]}",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "hook_calls_per_step": hooks.calls_per_step,
            "hooks_us_per_step": hooks.hooks_us_per_step,
            "hooks_us_by_name": hooks.hooks_us_by_name,
        },
        recommendation=(
            f"Hooks registered on modules ({', '.join(names[:3])}) run at every call of their module, every step: "
            "statistics, logging or feature capture there cost the step each time." + sync + " Do the work every N "
            "steps (a step counter checked inside the hook), or remove the hook (handle.remove()) while it is not needed."
        ),
    )


ANOMALY = Threshold(0, "any NaN check or stack capture of autograd's anomaly mode (tuning guide: disable debugging APIs)")


@rule(
    "host_overhead.anomaly_mode",
    "host_overhead",
    ANOMALY,
    severity=Severities(base="warning", critical_from=CRITICAL_SHARE),
    fixes=(
        Fix(
            kind="code_change",
            target="torch.autograd.set_detect_anomaly",
            value="torch.autograd.set_detect_anomaly(False)",
            summary="turn anomaly detection off for training (remove detect_anomaly() around the loop); use it "
            "only to find where a NaN comes from",
        ),
    ),
)
def host_overhead_anomaly_mode(ctx: Context) -> Optional[Verdict]:
    """Autograd's anomaly detection is on: a NaN check after each backward node, a Python stack saved for
    each node the forward creates."""
    anomaly = ctx.report.measurements.anomaly
    recorded = ctx.environment().get("anomaly_mode") is True
    if anomaly.nan_checks_per_step <= 0 and anomaly.stack_captures_per_step <= 0 and not recorded:
        return None
    share, share_range = _anomaly_cost(ctx)
    parts = []
    if anomaly.nan_checks_per_step > 0:
        parts.append(f"{anomaly.nan_checks_per_step:.0f} NaN checks")
    if anomaly.stack_captures_per_step > 0:
        parts.append(f"{anomaly.stack_captures_per_step:.0f} stacks saved")
    measured = f": {' and '.join(parts)} per step" if parts else ""
    unmeasured = []
    if anomaly.stack_captures_per_step <= 0:
        unmeasured.append(
            "the stacks it saves for each autograd node are not measured (they are recorded only with stacks, "
            "with_stack=True: without them their time is inside the forward operators)"
        )
    if anomaly.nan_checks_per_step <= 0:
        unmeasured.append("no NaN check was recorded (check_nan=False)")
    gpu = (
        " On a GPU each check's .item() waits for the device: one synchronisation per backward node."
        if ctx.has_device and anomaly.nan_checks_per_step > 0
        else ""
    )
    return Verdict(
        title="Autograd anomaly detection is on" + (measured if share is not None else " (its cost is not measured in this trace)"),
        share=share,
        share_range=share_range,
        evidence={
            "nan_checks_per_step": anomaly.nan_checks_per_step,
            "nan_check_us_per_step": anomaly.nan_check_us_per_step,
            "stack_captures_per_step": anomaly.stack_captures_per_step,
            "stack_capture_us_per_step": anomaly.stack_capture_us_per_step,
            **({"anomaly_mode_in_manifest": True} if recorded else {}),
        },
        recommendation=(
            "torch.autograd.set_detect_anomaly(True) (or a detect_anomaly() block around the loop) is a debugging "
            "aid: it saves a Python stack for every autograd node the forward creates and checks every output of "
            "every backward node for NaNs." + gpu + " Turn it off for training and use it only to find where a "
            "NaN comes from."
            + (" Not measured: " + "; ".join(unmeasured) + "." if unmeasured else "")
        ),
    )


def _anomaly_cost(ctx: Context) -> tuple[Optional[float], Optional[tuple[float, float]]]:
    """The share of the step anomaly mode costs, with its range.

    The stacks are Python, slowed by the tracer like the forward around them: scaled as that phase is. The
    checks are native operators, which the profiler slows less than the many small nodes of the backward
    around them: their cost lies between their share scaled as the backward is and their recorded time over
    the unprofiled step. On a GPU the checks' syncs save what the what-if model says of them."""
    anomaly = ctx.report.measurements.anomaly
    if anomaly.nan_check_us_per_step <= 0 and anomaly.stack_capture_us_per_step <= 0:
        return None, None
    stacks = ctx.share(anomaly.stack_capture_us_per_step) * unprofiled_scale(ctx, "forward")
    checks_us = anomaly.nan_check_us_per_step
    sync = ctx.report.measurements.sync
    synced_us = min(sync.by_op.get(ANOMALY_CHECK, 0.0), checks_us)
    if ctx.has_device and synced_us > 0:
        all_us = sum(sync.by_op.values())
        _, (sync_low, sync_high) = ctx.cost("sync", ctx.share(synced_us), scale=synced_us / all_us)
        checks_us -= synced_us
    else:
        sync_low = sync_high = 0.0
    low, high = recorded_bounds(ctx, checks_us, checks_us, "backward")
    low, high = min(stacks + sync_low + low, 1.0), min(stacks + sync_high + high, 1.0)
    return (low + high) / 2.0, (low, high)


GC_PAUSES = Threshold(0.02, ">= 2 % of the step in Python garbage collections, or a pause >= 1 ms (MSPROF gc.yaml: a GC event over 1000 us)")
LONG_GC_PAUSE_US = 1000.0


@rule(
    "host_overhead.gc_pauses",
    "host_overhead",
    GC_PAUSES,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="gc.freeze",
            value="gc.freeze()",
            summary="call it once the model, datasets and caches are built: the objects that exist then are never "
            "walked by a collection again",
        ),
    ),
)
def host_overhead_gc_pauses(ctx: Context) -> Optional[Verdict]:
    """Python's garbage collector stops the training thread: full collections walk every object the process
    holds, young ones the step's own container objects."""
    gc = ctx.report.measurements.gc
    if gc.unprofiled_steps > 0 and gc.unprofiled_step_mean_us > 0:
        # The capture's clock: every collection of 30 unprofiled steps, by generation, against their mean step.
        mean_us = gc.unprofiled_step_mean_us
        full, total = gc.unprofiled_full_gc_us_per_step / mean_us, gc.unprofiled_gc_us_per_step / mean_us
        longest, per_step = gc.unprofiled_longest_pause_us, gc.unprofiled_collections_per_step
        low, high = full / 2, total  # gc.freeze() spares most of the full collections; the young ones at best
        where = f"over {gc.unprofiled_steps:.0f} steps timed without the profiler"
    elif gc.collections_per_step > 0:
        # The trace's "Python GC" events: the recorded steps only, no generation.
        total = full = ctx.share(gc.gc_us_per_step)
        longest, per_step = gc.longest_pause_us, gc.collections_per_step
        low, high = 0.0, total
        where = "in the recorded steps"
    else:
        return None
    if total < GC_PAUSES.value and longest < LONG_GC_PAUSE_US:
        return None
    share = (low + high) / 2
    full_text = f", {pct(full)} in full collections" if gc.unprofiled_steps > 0 else ""
    return Verdict(
        title=f"Python's garbage collector takes {pct(total)} of the step{full_text} (longest pause {ms(longest)})",
        share=share,
        share_range=(low, high),
        evidence={
            "gc_share": total,
            "full_gc_share": full if gc.unprofiled_steps > 0 else None,
            "collections_per_step": per_step,
            "longest_pause_us": longest,
            "measured": where,
            **({"explicit_collections_per_step": gc.explicit_collections_per_step} if gc.explicit_collections_per_step else {}),
        },
        recommendation=(
            (
                f"{gc.explicit_collections_per_step:.3g} collection(s) per step are the script's own gc.collect(): "
                "call it every N steps, or not at all. "
                if gc.explicit_collections_per_step > 0
                else ""
            )
            + "Each collection stops the training thread. A full collection walks every object the process holds, so "
            "it grows with long-lived Python objects (a dataset index, caches of dicts or lists): call gc.freeze() "
            "once they are built, before the loop, and collections skip them from then on. Young collections free the "
            "reference cycles the step itself creates: create fewer container objects per step, or gc.disable() in "
            "the loop with gc.collect() every N steps (watch memory)."
        ),
    )


LAUNCH_BLOCKING = Threshold(0.9, ">= 90 % of kernels of 20 us or more end before their launch call returns (I: CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous)")
MIN_LONG_KERNELS = 10  # per run, for the fraction to mean something


def blocking_fraction(ctx: Context) -> float:
    """Of the kernels of 20 us or more, the part whose launch returned only after they ended."""
    launch = ctx.report.measurements.launch
    return launch.blocking_launches_per_step / launch.long_kernels_per_step if launch.long_kernels_per_step > 0 else 0.0


def launches_block(ctx: Context) -> bool:
    """Every launch waits for its kernel: the trace's launches where it has enough long kernels to tell (the
    variable may have been set after CUDA started, or for another process), else the environment the capture
    recorded."""
    launch = ctx.report.measurements.launch
    if launch.long_kernels_per_step * max(ctx.steps, 1) >= MIN_LONG_KERNELS:
        return blocking_fraction(ctx) >= LAUNCH_BLOCKING.value
    return ctx.environment().get("cuda_launch_blocking") is True


@rule(
    "synchronization.launch_blocking",
    "synchronization",
    LAUNCH_BLOCKING,
    severity=Severities(base="warning", critical_from=CRITICAL_SHARE),
    fixes=(
        Fix(
            kind="env_var",
            target="CUDA_LAUNCH_BLOCKING",
            value="0",
            summary="unset it (a debugging setting): kernel launches return at once and the CPU runs ahead of the GPU",
        ),
    ),
)
def synchronization_launch_blocking(ctx: Context) -> Optional[Verdict]:
    """Kernel launches are synchronous: the host waits for each kernel, so host and device never overlap."""
    if not ctx.has_device or not launches_block(ctx):
        return None
    launch = ctx.report.measurements.launch
    wait = ctx.share(launch.launch_wait_us_per_step)
    # Blocking, the host's and the device's time add up; asynchronous, the step is at least the device's busy
    # time: at most the wait, and at most the step less that busy time, is saved (when the two overlap fully);
    # the low end keeps half of it (syncs and dependencies the host still waits for).
    busy = ctx.report.device.utilization
    high = min(wait, max(1.0 - busy, 0.0)) if busy is not None else wait
    share, share_range = (0.75 * high, (0.5 * high, high)) if high > 0 else (None, None)
    return Verdict(
        title=f"Kernel launches wait for their kernels (CUDA_LAUNCH_BLOCKING): {ms(launch.launch_wait_us_per_step)} per step",
        share=share,
        share_range=share_range,
        evidence={
            "blocking_launch_fraction": blocking_fraction(ctx),
            "long_kernels_per_step": launch.long_kernels_per_step,
            "launch_wait_us_per_step": launch.launch_wait_us_per_step,
            "gpu_utilization": busy,
            **({"cuda_launch_blocking_in_environment": True} if ctx.environment().get("cuda_launch_blocking") is True else {}),
        },
        recommendation=(
            "Every kernel launch returned only after its kernel finished, as with CUDA_LAUNCH_BLOCKING=1 (a debugging "
            "setting that makes CUDA errors point at the right line): the CPU cannot queue work ahead, so the host's "
            "and the GPU's time add up instead of overlapping. Unset it for training."
        ),
    )


SYNC = Threshold(0.03, "any is reported; warning from 3 % of the step (NSYS `cuda_api_sync` lists all; MSPROF co-occurrence)")


@rule(
    "synchronization.host_device",
    "synchronization",
    SYNC,
    severity=by_share(SYNC.value),
    fixes=(
        Fix(
            kind="code_change",
            target="Tensor.item",
            value="running_loss += loss.detach()",
            summary="remove .item()/.cpu()/print()/torch.cuda.synchronize()/nonzero() from the per-step path: "
            "accumulate on the GPU and read every N steps",
        ),
        Fix(
            kind="torch_flag",
            target="torch.cuda.set_sync_debug_mode",
            value="warn",
            summary="diagnostic, not a speed-up: warns at every call that synchronises, with its stack",
        ),
    ),
)
def synchronization_host_device(ctx: Context) -> Optional[Verdict]:
    """The host blocks until the device drains (syncs other than those issued by copies)."""
    sync = ctx.report.measurements.sync
    if sync.syncs_per_step <= 0 or not ctx.has_device:
        return None
    # Syncs issued by copy ops are the h2d_copy.blocking finding, anomaly mode's checks and the module hooks'
    # their own: count them once.
    by_op = {op: us for op, us in sync.by_op.items() if op not in COPY_OPS and op not in (ANOMALY_CHECK, MODULE_HOOK_SYNCS)}
    if not by_op:
        return None
    us = sum(by_op.values())
    all_us = sum(sync.by_op.values())
    share, share_range = ctx.cost("sync", ctx.share(us), scale=us / all_us if all_us else 0.0)
    sites = sync.call_sites
    return Verdict(
        title=f"The host waits for the GPU in synchronisations: {ms(us)} per step"
        + f", mostly in {next(iter(by_op))}",
        share=share,
        share_range=share_range,
        evidence={
            "syncs_per_step_incl_copies": sync.syncs_per_step,
            "sync_us_per_step": us,
            "by_op_us_per_step": by_op,
            "call_sites_us_per_step": sites,
        },
        recommendation=(
            "Each sync stalls the CPU until the GPU drains, so the next kernels are launched late. Remove "
            ".item()/.cpu()/print()/torch.cuda.synchronize()/nonzero() from the per-step path (accumulate on the GPU "
            "and read every N steps); find them with torch.cuda.set_sync_debug_mode('warn')."
            + (f" Call sites: {', '.join(list(sites)[:3])}." if sites else "")
        ),
    )
