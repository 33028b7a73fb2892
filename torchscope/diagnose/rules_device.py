"""Device rules: idle gaps, compute (tensor cores, layouts, autotuning, occupancy, the compute-bound
verdict) and memory."""

from __future__ import annotations

from typing import Any, Optional

from torchscope.analysis.peaks import gpu_peak
from torchscope.diagnose.context import Context, as_int, ms, pct
from torchscope.diagnose.rule import WARNING, Severities, Threshold, Verdict, by_share, rule
from torchscope.diagnose.rules_quality import STEADY_RECOMPILATION, recorded_bounds, steady_recompilation, unprofiled_share
from torchscope.diagnose.rules_host import (
    TORCH_COMPILE,
    idle_share,
    is_launch_bound,
    launches_block,
    top_idle_host_ops,
    unexplained_idle_share,
)
from torchscope.report.model import DeviceSummary, Fix

LOW_UTILIZATION = Threshold(0.5, "GPU utilisation < 50 % (TB, NSYS `gpu_time_util`)")


# No fix as data: what fills the gaps differs from run to run; the recommendation names the host ops.
@rule("idle.device", "idle", LOW_UTILIZATION, severity=by_share())
def idle_device(ctx: Context) -> Optional[Verdict]:
    """The GPU idles while the host is neither loading data nor blocked in a sync (and the run is not
    launch-bound, which host_overhead.launch_bound reports, nor launching synchronously, which
    synchronization.launch_blocking does)."""
    utilization = ctx.report.device.utilization
    if not ctx.report.device.present or utilization is None or is_launch_bound(ctx) or launches_block(ctx):
        return None
    share = unexplained_idle_share(ctx)
    if share <= 0 or utilization >= LOW_UTILIZATION.value:
        return None
    host_ops = top_idle_host_ops(ctx)
    return Verdict(
        title=f"GPU idle {pct(idle_share(ctx))} of the step (kernel utilisation {pct(utilization)}); "
        f"{pct(share)} while the host was neither loading data nor waiting in a sync",
        share=share,
        evidence={
            "device_idle_share": idle_share(ctx),
            "gpu_utilization": utilization,
            "unexplained_idle_share": share,
            "host_ops_during_idle_us_per_step": host_ops,
        },
        recommendation=(
            "During the gaps the host was busy with: " + ", ".join(host_ops) + ". Shorten that host work, overlap "
            "it with GPU work, or raise the batch size so each step gives the GPU more to do."
            if host_ops
            else "Raise the batch size or overlap host work with GPU work."
        ),
    )


TENSOR_CORES = Threshold(7, "TB rule (`computeMajor >= 7 and tc_ratio == 0 and eligible > 0`)")
AMP_RECOVERABLE = 0.5  # assume AMP/TF32 halves the eligible FP32 kernel time (V100/A100 GEMMs gain 2-8x)
AUTOCAST = Fix(
    kind="code_change",
    target="torch.autocast",
    value="torch.autocast('cuda', dtype=torch.bfloat16)",
    summary="around forward and loss: matmuls and convolutions in bfloat16 (float16 with torch.amp.GradScaler before Ampere)",
)


@rule(
    "compute.tensor_cores_unused",
    "compute",
    TENSOR_CORES,
    severity=by_share(),
    fixes=(
        AUTOCAST,
        Fix(
            kind="torch_flag",
            target="torch.backends.cuda.matmul.allow_tf32",
            value=True,
            summary="FP32 matmuls on tensor cores in TF32 (same as torch.set_float32_matmul_precision('high'))",
        ),
    ),
)
def compute_tensor_cores_unused(ctx: Context) -> Optional[Verdict]:
    """FP32 GEMMs/convolutions on a GPU with tensor cores, and no kernel using them."""
    device = ctx.report.device
    major = int(device.compute_capability.split(".")[0]) if device.compute_capability else 0
    eligible = device.tensor_core_eligible_share
    if not (device.present and major >= TENSOR_CORES.value and device.tensor_core_kernel_share == 0 and eligible):
        return None
    kernel_share = ctx.breakdown_share("kernel")
    share = AMP_RECOVERABLE * eligible * kernel_share
    return Verdict(
        title=f"No kernel uses tensor cores, yet {pct(eligible)} of kernel time comes from "
        "tensor-core-eligible ops (GEMM/convolution)",
        share=share,
        evidence={
            "tensor_core_kernel_share": device.tensor_core_kernel_share,
            "eligible_kernel_share": eligible,
            "kernel_step_share": kernel_share,
            "compute_capability": device.compute_capability,
        },
        recommendation=(
            "Run matmuls/convolutions in reduced precision: torch.autocast('cuda', dtype=torch.bfloat16) "
            "(or float16 with GradScaler on pre-Ampere GPUs), and torch.backends.cuda.matmul.allow_tf32 = True / "
            "torch.set_float32_matmul_precision('high') for the remaining FP32 work."
        ),
    )


LAYOUT_TRANSPOSES = Threshold(0, "any transpose kernel (I)")
_LAYOUT_KERNELS = ("nchwToNhwc", "nhwcToNchw", "nchw_to_nhwc", "nhwc_to_nchw")
CHANNELS_LAST = Fix(
    kind="code_change",
    target="channels_last",
    value="model = model.to(memory_format=torch.channels_last)",
    summary="keep activations in NHWC (inputs too: batch.to(memory_format=torch.channels_last))",
)


@rule("compute.layout_transposes", "compute", LAYOUT_TRANSPOSES, fixes=(CHANNELS_LAST,))
def compute_layout_transposes(ctx: Context) -> Optional[Verdict]:
    """Layout transposes around convolutions: channels_last is missing."""
    transposes = [k for k in ctx.report.kernels if any(p in k.name for p in _LAYOUT_KERNELS)]
    if not ctx.report.device.present or len(transposes) <= LAYOUT_TRANSPOSES.value:
        return None
    steps = max(ctx.steps, 1)
    us = sum(k.total_us for k in transposes) / steps
    return Verdict(
        title=f"Convolutions convert memory layouts ({sum(k.calls for k in transposes) / steps:.0f} transpose kernels per step)",
        share=ctx.share(us),
        evidence={"transpose_us_per_step": us, "kernels": [k.name for k in transposes[:3]]},
        recommendation="Keep activations in channels_last: model.to(memory_format=torch.channels_last) and "
        "inputs .to(memory_format=torch.channels_last), so cuDNN's NHWC tensor-core kernels need no transposes.",
    )


CUDNN_BENCHMARK = Threshold(0, "any convolution with `cudnn_benchmark == false` in the manifest (I; tuning guide)")


@rule(
    "compute.cudnn_benchmark_off",
    "compute",
    CUDNN_BENCHMARK,
    fixes=(
        Fix(
            kind="torch_flag",
            target="torch.backends.cudnn.benchmark",
            value=True,
            summary="cuDNN times its algorithms once per input shape and keeps the fastest (fixed shapes only)",
        ),
    ),
)
def compute_cudnn_benchmark_off(ctx: Context) -> Optional[Verdict]:
    """Convolutions with cuDNN autotuning off (recorded in the capture manifest)."""
    if not ctx.report.device.present or ctx.environment().get("cudnn_benchmark") is not False:
        return None
    convolutions = sum(1 for op in ctx.report.operators if "convolution" in op.name)
    if convolutions <= CUDNN_BENCHMARK.value:
        return None
    return Verdict(
        title="cudnn.benchmark is off in a convolutional model",
        share=None,
        evidence={"cudnn_benchmark": False},
        recommendation="With fixed input shapes set torch.backends.cudnn.benchmark = True so cuDNN picks the "
        "fastest convolution algorithm once (keep it off when shapes change every step).",
    )


LOW_OCCUPANCY = Threshold(30, "< 30 % est. achieved occupancy while kernels fill > 50 % of the step (I)")
KERNEL_HEAVY = 0.5


@rule("compute.low_occupancy", "compute", LOW_OCCUPANCY, fixes=(TORCH_COMPILE,))
def compute_low_occupancy(ctx: Context) -> Optional[Verdict]:
    """Kernels that leave most of each SM idle, in a run whose time is mostly kernels."""
    device = ctx.report.device
    occupancy = device.achieved_occupancy_pct
    if not device.present or occupancy is None or occupancy >= LOW_OCCUPANCY.value:
        return None
    if ctx.breakdown_share("kernel") <= KERNEL_HEAVY:
        return None
    return Verdict(
        title=f"Kernels reach a low estimated occupancy ({occupancy:.0f}%)",
        share=None,
        evidence={"achieved_occupancy_pct": occupancy, "sm_efficiency": device.sm_efficiency},
        recommendation="Small kernels leave SMs idle: raise the batch size (multiples of 8), fuse kernels "
        "(torch.compile), use channels_last for convolutions.",
    )


THREADS = Threshold(
    0.05,
    "CPU traces: fewer intra-op threads than the physical cores a rank has free of DataLoader workers, where giving "
    "forward and backward those cores would save >= 5 % of the step at perfect scaling (I)",
)
THREADS_SCALING_LOW = 0.5  # the pessimistic end: small and memory-bound ops gain little from more threads


@rule(
    "compute.threads",
    "compute",
    THREADS,
    severity=by_share(THREADS.value),
    fixes=(
        Fix(kind="torch_flag", target="torch.set_num_threads", summary="as many intra-op threads as the rank has cores free of DataLoader workers"),
        Fix(kind="env_var", target="OMP_NUM_THREADS", summary="the same, set for every rank before it starts (torchrun sets 1 when it starts several per node)"),
    ),
)
def compute_threads(ctx: Context) -> Optional[Verdict]:
    """CPU runs whose operators use fewer intra-op threads than the rank's free cores: the parallel
    operators of forward and backward would run up to cores/threads faster."""
    environment = ctx.environment()
    # Physical cores, not hardware threads: torch's default is one thread per core, and a second thread
    # on a core's sibling rarely helps. Not judged without them (an older manifest, not Linux).
    threads, cores = as_int(environment.get("torch_num_threads")), as_int(environment.get("physical_cores"))
    if ctx.has_device or not threads or not cores:
        return None
    ranks = max(as_int(environment.get("local_world_size")) or 1, 1)
    workers = as_int(ctx.main_loader().get("num_workers")) or 0
    free = max(cores // ranks - workers, 1)
    compute = sum(unprofiled_share(ctx, phase) or ctx.phase_share(phase) for phase in ("forward", "backward"))
    high = compute * (1.0 - threads / free)
    if high < THREADS.value:
        return None
    low = THREADS_SCALING_LOW * high
    omp = environment.get("omp_num_threads")
    by_torchrun = ranks > 1 and str(omp) == "1"
    return Verdict(
        title=f"Operators run on {threads} intra-op thread(s) while {free} core(s) are free for them",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "torch_num_threads": threads,
            "physical_cores": cores,
            "local_world_size": ranks,
            "dataloader_workers": workers,
            "omp_num_threads": omp,
            "compute_share": compute,
        },
        recommendation=f"Forward and backward take {pct(compute)} of the step on {threads} thread(s). With {cores} "
        f"physical core(s), {ranks} rank(s) on this machine and {workers} DataLoader worker(s), {free} core(s) per rank are "
        f"free for compute: call torch.set_num_threads({free}) at the start of the script"
        + (f" (torchrun sets OMP_NUM_THREADS=1 when it starts several ranks per node: run it with "
           f"OMP_NUM_THREADS={free})" if by_torchrun else "")
        + ". Large matmuls and convolutions scale with the threads; small and memory-bound operators less.",
        fix_values={"torch.set_num_threads": free, "OMP_NUM_THREADS": str(free)},
        fix_targets=("torch.set_num_threads", "OMP_NUM_THREADS") if omp is not None else ("torch.set_num_threads",),
    )


RECOMPUTE = Threshold(0.05, "activation checkpointing's recomputation and bookkeeping >= 5 % of the step (I; torch.utils.checkpoint trades compute for memory)")


@rule(
    "compute.recompute",
    "compute",
    RECOMPUTE,
    severity=Severities(base="info", warning_from=0.30),
    fixes=(
        Fix(
            kind="code_change",
            target="torch.utils.checkpoint",
            summary="checkpoint fewer blocks, or only the layers whose activations are large (selective activation "
            "checkpointing), where memory allows",
        ),
    ),
)
def compute_recompute(ctx: Context) -> Optional[Verdict]:
    """Activation checkpointing runs blocks' forward again in the backward: compute paid for memory."""
    section = ctx.report.measurements.recompute
    if section.recomputed_calls_per_step <= 0:
        return None
    recorded_us = section.recompute_us_per_step + section.bookkeeping_us_per_step
    # Low: the recomputed blocks alone, as their phases are slowed by the profiler; high: all of it as
    # recorded over the unprofiled step (the profiler only adds time).
    low, high = recorded_bounds(ctx, section.recompute_us_per_step, recorded_us, "forward", "backward")
    if high < RECOMPUTE.value:
        return None
    peaks = {d: b for d, b in ctx.report.measurements.memory.peak_allocated_bytes.items() if gpu_capacity(ctx.report.device, d)}
    memory = ""
    if peaks:
        device, peak = max(peaks.items(), key=lambda kv: kv[1])
        capacity = gpu_capacity(ctx.report.device, device) or 0
        memory = f" The peak allocated memory is {pct(peak / capacity)} of {device}'s capacity: the room checkpointing fewer blocks would use."
    modules = ", ".join(list(section.modules_us_per_step)[:3])
    where = "of the GPU's time" if section.time_base == "device" else "of host time"
    return Verdict(
        title=f"Activation checkpointing recomputes {section.recomputed_calls_per_step:.0f} block(s) per step in the "
        f"backward ({ms(section.recompute_us_per_step)} {where}" + (f", {ms(section.bookkeeping_us_per_step)} of checkpoint bookkeeping" if section.bookkeeping_us_per_step > 0 else "") + ")",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "recomputed_calls_per_step": section.recomputed_calls_per_step,
            "recompute_us_per_step": section.recompute_us_per_step,
            "bookkeeping_us_per_step": section.bookkeeping_us_per_step,
            "modules_us_per_step": section.modules_us_per_step,
            **({"peak_allocated_bytes": peaks} if peaks else {}),
        },
        recommendation=(
            f"torch.utils.checkpoint keeps a block's inputs instead of its activations and runs its forward again "
            f"in the backward ({modules}): compute paid for memory. If memory allows, checkpoint fewer blocks, or only "
            "the layers whose activations are large." + memory
        ),
    )


FLOAT64 = Threshold(0.05, ">= 5 % of the step in operators with float64 (double) tensor inputs (I; recorded input types)")
# What float32 saves of the float64 ops' own time: on a CPU twice the SIMD lanes and half the bytes (a 3-layer
# MLP's step 18.2 -> 9.0 ms, 52 % of the float64 ops' time), less where dispatch dominates small ops; on a GPU
# from half (data-centre parts' FP64 units, memory-bound kernels) to nearly all (1/32-1/64 FP64 rate, no TF32).
FLOAT64_SAVING = {"host": (0.3, 0.6), "device": (0.5, 0.95)}


@rule(
    "compute.float64",
    "compute",
    FLOAT64,
    severity=by_share(),
    fixes=(
        Fix(
            kind="torch_flag",
            target="torch.set_default_dtype",
            value="torch.float32",
            summary="make new tensors and parameters float32 (the default) instead of float64",
        ),
        Fix(
            kind="code_change",
            target="torch.Tensor.float",
            value="model = model.float(); x = torch.from_numpy(array).float()",
            summary="convert the model and its inputs to float32 (NumPy arrays are float64 by default)",
        ),
    ),
)
def compute_float64(ctx: Context) -> Optional[Verdict]:
    """The model (or part of it) computes in float64."""
    section = ctx.report.measurements.float64
    if section.float64_us_per_step <= 0 or ctx.share(section.float64_us_per_step) < FLOAT64.value:
        return None
    low_factor, high_factor = FLOAT64_SAVING.get(section.time_base, FLOAT64_SAVING["host"])
    us = section.float64_us_per_step
    low, high = recorded_bounds(ctx, low_factor * us, high_factor * us, "forward", "backward", "optimizer")
    # The ops are at most the whole step: float32 saves at most its factor of the step.
    low, high = min(low, high_factor), min(high, high_factor)
    default = ctx.environment().get("default_dtype") == "torch.float64"
    ops = ", ".join(list(section.by_op)[:3])
    where = "of the GPU's time" if section.time_base == "device" else "of host time"
    cause = (
        "torch.set_default_dtype(torch.float64) is in effect, so every new tensor and parameter is float64: set it "
        "back to torch.float32 (or remove the call)"
        if default
        else "convert the model and its inputs to float32 (model.float(); NumPy arrays are float64, so "
        "torch.from_numpy(a).float() or torch.tensor(a, dtype=torch.float32))"
    )
    return Verdict(
        title=f"Operators compute in float64: {ms(us)} per step {where} ({pct(ctx.share(us))} of the step), mostly {ops}",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "float64_ops_per_step": section.ops_per_step,
            "float64_us_per_step": us,
            "typed_ops_us_per_step": section.typed_ops_us_per_step,
            "by_op_us_per_step": section.by_op,
            **({"default_dtype": "torch.float64"} if default else {}),
        },
        recommendation=(
            f"float64 runs at half float32's rate on a CPU and at 1/2 to 1/64 of it on a GPU (no tensor cores): {cause}. "
            "If part of the problem needs double precision (an ill-conditioned solve, a loss summed over many terms), "
            "keep only that part in float64."
        ),
        fix_targets=("torch.set_default_dtype",) if default else ("torch.Tensor.float",),
    )


CPU_HALF_EMULATED = Threshold(
    0.05,
    ">= 5 % of the step in bfloat16/float16 matmuls on a CPU whose oneDNN has no kernels for the dtype, or where "
    "they ran at under half of float32's speed in the check at capture end (I: ATen's CPU matmuls fall back to "
    "scalar code without them, measured 0.5 against 38.7 GFLOP/s on an AVX2 machine)",
)
SLOW_HALF_SPEED = 0.5  # a dtype's matmul speed over float32's below which float32 is the faster choice
# The share of the float32 matmul rate measured at capture end that a run's own matmuls reach, low and high:
# the 512x512 check is a best case; a 4-layer GPT's and an attention block's float32 matmuls reached 52 %.
FP32_MATMUL_EFFICIENCY = (0.25, 1.0)


@rule(
    "compute.cpu_half_emulated",
    "compute",
    CPU_HALF_EMULATED,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="torch.autocast",
            value="torch.autocast('cpu', dtype=torch.bfloat16, enabled=False)",
            summary="compute in float32 on this CPU: drop the bfloat16/float16 autocast (or model.half()) here",
        ),
    ),
)
def compute_cpu_half_emulated(ctx: Context) -> Optional[Verdict]:
    """bfloat16/float16 matmuls on a CPU without fast kernels for them (AVX2 machines: no AVX512 for
    oneDNN's bfloat16, no AVX512-FP16/AMX): far slower than the float32 the precision was meant to beat."""
    if ctx.has_device:
        return None
    peak = ctx.environment().get("cpu_peak")
    if not isinstance(peak, dict):
        return None  # the capture did not check this CPU (a trace from elsewhere): no verdict on its kernels
    patterns = ctx.report.measurements.patterns
    fp32 = peak.get("matmul_gflops")
    fp32_gflops = float(fp32) if isinstance(fp32, (int, float)) and fp32 > 0 else None
    slow: dict[str, tuple[float, float, float]] = {}  # dtype -> (us per step, float32's us: low, high)
    for dtype, us in patterns.half_matmul_us_per_step.items():
        if not _slow_half(peak, dtype):
            continue
        checked = _checked_speed(peak, dtype)
        gflop = patterns.half_matmul_gflop_per_step.get(dtype, 0.0)
        if fp32_gflops and gflop > 0:
            # The same FLOPs in float32 at FP32_MATMUL_EFFICIENCY of the rate measured at capture end: a run's
            # matmuls reach a part of it (their shapes, the threads); the check's ratio assumes all of it.
            fast, slow_fp32 = (gflop / (fp32_gflops * e) * 1e6 for e in FP32_MATMUL_EFFICIENCY[::-1])
        else:  # no shapes recorded: the check's ratio, and twice it
            ratio = min(checked, 1.0) if checked is not None else SLOW_HALF_SPEED
            fast, slow_fp32 = us * ratio, us * min(2 * ratio, 1.0)
        slow[dtype] = (us, min(fast, us), min(slow_fp32, us))
    us = sum(us for us, _, _ in slow.values())
    if us <= 0 or ctx.share(us) < CPU_HALF_EMULATED.value:
        return None
    high = ctx.share(sum(us_ - fast for us_, fast, _ in slow.values()))
    low = ctx.share(sum(us_ - slow_fp32 for us_, _, slow_fp32 in slow.values()))
    dtypes = " and ".join(slow)
    fp32_text = " and ".join(f"{ms(fast)}-{ms(slow_fp32)}" for _, fast, slow_fp32 in slow.values())
    return Verdict(
        title=f"{dtypes} matmuls take {ms(us)} per step ({pct(ctx.share(us))} of the step) on a CPU without fast "
        f"{dtypes} kernels; in float32 about {fp32_text}",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "half_matmul_us_per_step": {dtype: us_ for dtype, (us_, _, _) in slow.items()},
            "float32_us_per_step_estimate": {dtype: [fast, slow_fp32] for dtype, (_, fast, slow_fp32) in slow.items()},
            **{f"{dtype}_native": peak.get(f"{dtype}_native") for dtype in slow if f"{dtype}_native" in peak},
            **{f"{dtype}_matmul_speed_at_capture_end": peak[f"{dtype}_matmul_speed"] for dtype in slow if f"{dtype}_matmul_speed" in peak},
            "fp32_matmul_gflops": fp32_gflops,
        },
        recommendation=(
            f"This CPU has no fast {dtypes} matmul kernels (oneDNN needs AVX512 for bfloat16, AVX512-FP16 or AMX for "
            f"float16), so ATen runs these matmuls in a scalar fallback, far slower than float32. Train in float32 "
            f"on this machine: remove torch.autocast('cpu', dtype=torch.{next(iter(slow))}) (or pass enabled=False) "
            "and any model.half()/.bfloat16(); keep the lower precision for CPUs with AVX512-BF16/AMX "
            "(torch.backends.cpu.get_cpu_capability() reports what torch uses) or for the GPU."
        ),
    )


GRAPH_BREAKS = Threshold(0.02, "any graph break inside a compiled call, its part of the time between graphs >= 2 % of the step (COMPILE-PROF: graph breaks split CompiledFunction into pieces)")


@rule(
    "compute.graph_breaks",
    "compute",
    GRAPH_BREAKS,
    severity=by_share(),
    fixes=(
        Fix(kind="env_var", target="TORCH_LOGS", value="graph_breaks", summary="log each graph break with its reason and source line"),
        Fix(
            kind="code_change",
            target="torch.compile",
            value="torch.compile(model, fullgraph=True)",
            summary="make every graph break an error, to find and remove them one by one",
        ),
    ),
)
def compute_graph_breaks(ctx: Context) -> Optional[Verdict]:
    """torch.compile splits the compiled model into several graphs, with Python between them."""
    section = ctx.report.measurements.graph_breaks
    if section.breaks_per_step <= 0 or section.graphs_per_step <= 0:
        return None
    breaks = section.breaks_per_step
    if section.ddp_forwards_per_step > 0:
        # DDPOptimizer splits the model into a graph per gradient bucket, by design: only the breaks that left a
        # resume frame are the code's (none can be told apart without stacks).
        breaks = min(breaks, sum(section.locations.values()))
        if breaks <= 0:
            return None
    # What breaks cost beyond one graph per call: the time between graphs less one graph's share of it;
    # the Python there is slowed by the tracer as the forward and backward are. Lost fusion is not in it.
    us = section.between_graphs_us_per_step * breaks / section.graphs_per_step
    low, high = recorded_bounds(ctx, us, us, "forward")
    if high < GRAPH_BREAKS.value:
        return None
    where = list(section.locations)
    at = f", at {', '.join(where[:3])}" if where else ""
    idle = " of device idle time" if section.time_base == "device_idle" else ""
    return Verdict(
        title=f"torch.compile breaks the graph {breaks:.0f} time(s) per step ({section.graphs_per_step:.0f} "
        f"graphs in {section.compiled_calls_per_step:.0f} compiled call(s){at}): {ms(section.between_graphs_us_per_step)}"
        f"{idle} per step between graphs",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "graphs_per_step": section.graphs_per_step,
            "compiled_calls_per_step": section.compiled_calls_per_step,
            "breaks_per_step": section.breaks_per_step,
            "between_graphs_us_per_step": section.between_graphs_us_per_step,
            **({"break_locations_per_step": section.locations} if where else {}),
        },
        recommendation=(
            "Where dynamo cannot trace it ends the graph, runs Python and starts another: each break costs guards, "
            "wrappers and the Python in between, and no fusion crosses it (not counted here). "
            + (f"The graph breaks at {', '.join(where[:3])}. " if where else "")
            + "Run once with TORCH_LOGS=graph_breaks (or torch._dynamo.explain(model)(*inputs)) for each break's reason; "
            "the usual ones are .item(), float() or bool() of a tensor (a data-dependent if), print/logging and "
            "calls dynamo cannot trace: compute on tensors instead (torch.where), move them out of the compiled code, "
            "or compile with fullgraph=True to make each break an error."
        ),
    )


RECOMPILES = Threshold(
    STEADY_RECOMPILATION,
    "recompilations (compile ids F/R with R >= 1) in at least every other profiled step, more than one "
    "(COMPILE-PROF: compile ids; torch.compile docs: recompilation)",
)


@rule(
    "compute.recompiles",
    "compute",
    RECOMPILES,
    severity=by_share(),
    fixes=(
        Fix(
            kind="code_change",
            target="torch._dynamo.mark_dynamic",
            value="torch._dynamo.mark_dynamic(x, dim)",
            summary="before the call: one graph for every size of that dimension of the input",
        ),
        Fix(
            kind="code_change",
            target="torch.compile",
            value="torch.compile(model, dynamic=True)",
            summary="dynamic shapes from the first compilation (dynamic=False turns automatic dynamic shapes off)",
        ),
        Fix(kind="env_var", target="TORCH_LOGS", value="recompiles", summary="log which guard failed at each recompilation"),
    ),
)
def compute_recompiles(ctx: Context) -> Optional[Verdict]:
    """torch.compile compiles a frame again and again in the steady state, each time a guard fails."""
    section = ctx.report.measurements.compile
    if not steady_recompilation(ctx):
        return None
    us = section.recompilation_us_per_step
    # Compiling is Python, slowed by the tracer as the forward and backward around it are.
    low, high = recorded_bounds(ctx, us, us, "forward", "backward")
    ids = ", ".join(section.recompiled_ids[:5])
    varying = section.varying_inputs
    cause = (
        f"Between the recompiled graphs the inputs' shapes differ ({'; '.join(varying[:3])}): dynamo specialises each "
        "graph on its inputs' sizes, so a new size fails a guard and compiles another graph. Mark that dimension "
        "dynamic before the call (torch._dynamo.mark_dynamic(x, dim)), compile with dynamic=True (dynamic=False turns "
        "off the automatic dynamic shapes that would otherwise take over after one recompilation), or pad the inputs "
        "to a few fixed sizes (buckets) so that a handful of graphs serve every step."
        if varying
        else "Run once with TORCH_LOGS=recompiles to see which guard fails: an input of a new shape (mark the dimension "
        "dynamic, or pad to a few fixed sizes), dtype or device, a Python number that changes every step (the "
        "learning rate, a step counter: pass it as a tensor), or an attribute of the model that changes."
    )
    return Verdict(
        title=f"torch.compile recompiles in {pct(section.recompiling_steps_share)} of the steps "
        f"({ids}): {ms(us)} per step compiling ({pct(ctx.share(us))} of the step)",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "recompilations_per_step": section.recompilations_per_step,
            "recompilation_us_per_step": us,
            "recompiling_steps_share": section.recompiling_steps_share,
            "recompiled_ids": section.recompiled_ids,
            **({"varying_inputs": varying} if varying else {}),
        },
        recommendation=cause
        + " Each frame compiles at most torch._dynamo.config.recompile_limit (8) graphs; after that dynamo stops "
        "compiling it and runs it eagerly, slower than compiled and with no warning in the step times.",
        fix_targets=("torch._dynamo.mark_dynamic", "torch.compile", "TORCH_LOGS") if varying else ("TORCH_LOGS",),
    )


DROPOUT = Threshold(
    0.05,
    "CPU traces: dropout operators >= 5 % of the step (I; PyTorch's CPU generator draws the masks on one thread)",
)


@rule(
    "compute.dropout",
    "compute",
    DROPOUT,
    # A trade against regularisation, never more than a warning: the user decides what the model can spare.
    severity=by_share(0.3, None),
    fixes=(
        Fix(
            kind="code_change",
            target="dropout",
            value="p=0.0",
            summary="where regularisation allows (large-data pretraining commonly runs without dropout); "
            "attention-probability dropout first",
        ),
    ),
)
def compute_dropout(ctx: Context) -> Optional[Verdict]:
    """Dropout's random masks cost a CPU step a large share, on one thread however many the rank has."""
    section = ctx.report.measurements.dropout
    us = section.dropout_us_per_step
    low, high = recorded_bounds(ctx, us, us, "forward")
    if ctx.has_device or high < DROPOUT.value:
        return None
    return Verdict(
        title=f"Dropout takes {ms(us)} per step ({pct(ctx.share(us))} of the step), {ms(section.mask_us_per_step)} "
        f"of it drawing random masks ({section.calls_per_step:.0f} dropout call(s) per step)",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "dropout_calls_per_step": section.calls_per_step,
            "dropout_us_per_step": us,
            "mask_us_per_step": section.mask_us_per_step,
        },
        recommendation=(
            "On a CPU each dropout draws its mask with aten::bernoulli_, and PyTorch's CPU generator draws on one "
            "thread: that part does not shrink with more intra-op threads, and torch.compile keeps it (an encoder "
            "LM: 220 ms steps with dropout 0.1, 168 ms with 0; compiled, 270 and 202 ms). The time stated is the "
            "dropout's whole forward, which only p=0 (or no dropout layer) saves: a lower p saves part of it (one "
            "mask of 16x120x1024: 10.5 ms at p=0.1, 9.1 ms at 0.05, 7.9 ms at 0.01). If the model and data allow "
            "less regularisation, drop the dropout where it matters least (the attention probabilities' first, then "
            "the residual ones); pretraining on large data commonly runs with dropout=0. Its backward multiply comes "
            "on top."
        ),
    )


UNFUSED_ATTENTION = Threshold(
    0.05,
    "ops on materialised attention scores (softmax over a matmul's product, outside scaled_dot_product_attention) "
    ">= 5 % of the step (I; recorded shapes; PyTorch SDPA tutorial)",
)
# What fused attention saves against the score ops' own time, measured on the CPU against
# F.scaled_dot_product_attention: a 4-layer GPT (8 heads of 32) at T=256, 23 % of the step in score ops and 19 %
# saved (0.8x); T=512, 34 % and 57 % (1.7x: the matmuls' copies of the scores go too); a 1-block test model
# 46 % and 55 % (1.2x); nn.MultiheadAttention's need_weights path 27 % and 20 % (0.7x). Short sequences save
# less (T=128, 4 heads: 4.6 % and 1.3 %, under the threshold). Stated: the score ops' time, within half to twice it.
UNFUSED_ATTENTION_SAVING = (0.5, 2.0)
SDPA = Fix(
    kind="code_change",
    target="torch.nn.functional.scaled_dot_product_attention",
    value="y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p if self.training else 0.0, is_causal=causal)",
    summary="one fused call for matmul, scale, mask, softmax, dropout and matmul: the scores are never materialised",
)
NEED_WEIGHTS = Fix(
    kind="code_change",
    target="torch.nn.MultiheadAttention",
    value="out, _ = attn(q, k, v, need_weights=False)",
    summary="nn.MultiheadAttention computes attention op by op to return the weights (need_weights=True is its "
    "default); without them it calls scaled_dot_product_attention",
)


@rule("compute.unfused_attention", "compute", UNFUSED_ATTENTION, severity=by_share(), fixes=(SDPA, NEED_WEIGHTS))
def compute_unfused_attention(ctx: Context) -> Optional[Verdict]:
    """Attention written op by op materialises its scores; scaled_dot_product_attention fuses it."""
    section = ctx.report.measurements.attention
    us = section.score_us_per_step
    if us <= 0 or ctx.share(us) < UNFUSED_ATTENTION.value:
        return None
    low_factor, high_factor = UNFUSED_ATTENTION_SAVING
    low, high = recorded_bounds(ctx, low_factor * us, high_factor * us, "forward", "backward")
    compute = ctx.phase_share("forward") + ctx.phase_share("backward")
    high = min(high, compute) if compute > 0 else high  # no more than the forward and backward it lies in
    low = min(low, high)
    stated = min(max(recorded_bounds(ctx, us, us, "forward", "backward")[0], low), high)
    # On a CPU, SDPA with dropout_p > 0 runs its math path, which builds the scores as this code does.
    cpu_dropout = section.time_base == "host" and section.dropout_calls_per_step > 0
    if cpu_dropout:
        low = 0.0
    # Who made the calls: nn.MultiheadAttention's need_weights path, code of the user's (stacks seen), or unknown.
    mha = section.need_weights_calls_per_step > 0
    written = section.calls_with_stacks_per_step > section.need_weights_calls_per_step
    unknown = section.calls_per_step > section.calls_with_stacks_per_step
    where = "of the GPU's time" if section.time_base == "device" else "of host time"
    return Verdict(
        title=f"Attention is computed op by op: {section.calls_per_step:.0f} softmax(es) per step over materialised "
        f"scores ({', '.join(section.score_shapes[:3])}); the ops on them take {ms(us)} per step {where} "
        f"({pct(ctx.share(us))} of the step)",
        share=stated,
        share_range=(low, high),
        evidence={
            "attention_calls_per_step": section.calls_per_step,
            "score_shapes": section.score_shapes,
            "score_ops_us_per_step": us,
            "need_weights_calls_per_step": section.need_weights_calls_per_step,
            "calls_with_stacks_per_step": section.calls_with_stacks_per_step,
            "attention_dropout_calls_per_step": section.dropout_calls_per_step,
            "fused_attention_calls_per_step": section.fused_calls_per_step,
        },
        recommendation=(
            f"{_attention_fixes_text(mha, written, unknown)} The time stated is that of the scale, mask, softmax and "
            "their backward on the score tensors, each a full pass over batch x heads x queries x keys values; the "
            "matmuls stay. Measured on a CPU, the fused call saved from under that time (short sequences, where the "
            "fused kernel's own cost shows) to more than it (long ones, where the matmuls' copies of the scores go "
            f"too).{_attention_dropout_text(section.time_base, section.dropout_calls_per_step, section.dropout_p_unknown_calls_per_step)}"
        ),
        fix_targets=tuple(
            target
            for target, applies in (
                ("torch.nn.functional.scaled_dot_product_attention", written or unknown),
                ("torch.nn.MultiheadAttention", mha or unknown),
            )
            if applies
        ),
    )


def _attention_fixes_text(mha: bool, written: bool, unknown: bool) -> str:
    """The fixes for the callers seen: nn.MultiheadAttention's need_weights path, attention written out, or
    (no recorded stacks) either."""
    sdpa = (
        "replace the matmul-softmax-matmul sequence with F.scaled_dot_product_attention(q, k, v, attn_mask=..., "
        "dropout_p=..., is_causal=...): it picks a fused kernel (flash or memory-efficient on a GPU, a flash kernel on "
        "the CPU) that never materialises the scores, forward or backward."
    )
    need_weights = (
        "pass need_weights=False to nn.MultiheadAttention where the weights are not used (its output is the same): "
        "with need_weights=True, its default, it computes attention op by op to return the averaged weights; without, "
        "it calls F.scaled_dot_product_attention."
    )
    if unknown:
        return (
            f"Where this is nn.MultiheadAttention, {need_weights} Where it is attention written out, {sdpa} (No Python "
            "stacks were recorded, so the trace does not say which.)"
        )
    if mha and written:
        return f"Some calls come from nn.MultiheadAttention: {need_weights} The others are written out: {sdpa}"
    return f"nn.MultiheadAttention: {need_weights}" if mha else sdpa[0].upper() + sdpa[1:]


def _attention_dropout_text(time_base: str, dropped: float, unknown: float) -> str:
    if time_base != "host" or not (dropped or unknown):
        return ""
    why = (
        "on a CPU, SDPA with dropout_p > 0 takes its math path, which materialises the scores as this code does (a "
        "4-layer GPT with attention dropout 0.1: 348 ms a step written out, 356 ms with SDPA), so the saving needs "
        "attention dropout off as well."
    )
    if dropped:
        return f" This run drops out attention probabilities: {why}"
    return f" Dropout runs on the scores with a p the trace does not record: if it is above 0, {why}"


COMPUTE_BOUND = Threshold(0.5, "no other warning, and compute fills >= 50 % of the step (I)")


@rule("compute.bound", "compute", COMPUTE_BOUND, fixes=(AUTOCAST, TORCH_COMPILE))
def compute_bound(ctx: Context) -> Optional[Verdict]:
    """Stated when no other category reaches warning level (reads `ctx.findings`): the run is bound by
    its own compute. A verdict, not a cost: nothing here can be removed, so no time share."""
    if any(f.severity != "info" and f.category not in ("compute", "trace_quality") for f in ctx.findings):
        return None
    if ctx.steps == 0:
        return None
    if ctx.has_device:
        share = ctx.breakdown_share("kernel")
    else:  # torch.compile compiling inside the forward or backward is no compute of the model's
        compiling = ctx.share(ctx.report.measurements.compile.compilation_in_compute_us_per_step)
        share = max(ctx.phase_share("forward") + ctx.phase_share("backward") - compiling, 0.0)
    if share < COMPUTE_BOUND.value:
        return None
    where = (
        f"GPU kernels fill {pct(share)} of the step"
        if ctx.has_device
        else f"forward and backward operators fill {pct(share)} of the step"
    )
    roofline = matmul_roofline(ctx, share * ctx.mean_step_us * ctx.steps / 1e6)
    half = ctx.report.measurements.patterns.half_matmuls_per_step > 0
    compiled = ctx.report.measurements.compile.compiled_regions_per_step > 0
    # On a CPU that the capture found without fast bfloat16 kernels, bfloat16 is no way to faster math.
    no_bf16 = not ctx.has_device and _cpu_lacks_bf16(ctx)
    return Verdict(
        title=f"Compute-bound: {where}; no input, host or synchronisation bottleneck found" + _roofline_text(roofline, ctx.report.device.present),
        share=None,
        evidence={"compute_share": share, "top_operators": [op.name for op in ctx.report.operators[:3]], **roofline},
        recommendation=_faster_math(ctx, half, compiled, no_bf16),
        fix_values={} if ctx.has_device or half or no_bf16 else {"torch.autocast": "torch.autocast('cpu', dtype=torch.bfloat16)"},
        # What the run already does is no advice: matmuls in FP16/BF16, compiled regions in the steps.
        fix_targets=tuple(t for t, done in (("torch.autocast", half or no_bf16), ("torch.compile", compiled)) if not done),
    )


def _cpu_lacks_bf16(ctx: Context) -> bool:
    """The capture found no fast bfloat16 matmul kernels on this CPU (see compute.cpu_half_emulated)."""
    peak = ctx.environment().get("cpu_peak")
    return isinstance(peak, dict) and _slow_half(peak, "bfloat16")


def _checked_speed(peak: dict[str, Any], dtype: str) -> Optional[float]:
    """The dtype's matmul speed over float32's in the check at capture end (None: not checked)."""
    speed = peak.get(f"{dtype}_matmul_speed")
    return float(speed) if isinstance(speed, (int, float)) and speed > 0 else None


def _slow_half(peak: dict[str, Any], dtype: str) -> bool:
    """The check at capture end (`cpu_peak`) found no oneDNN kernels for the dtype, or its matmuls under half
    of float32's speed."""
    speed = _checked_speed(peak, dtype)
    return peak.get(f"{dtype}_native") is False or (speed is not None and speed < SLOW_HALF_SPEED)


def _faster_math(ctx: Context, half: bool, compiled: bool, no_bf16: bool = False) -> str:
    """compute.bound's advice, without what the run already does or what does not apply to it (`no_bf16`:
    a CPU without fast bfloat16 kernels, where bfloat16 is slower)."""
    # channels_last and cudnn.benchmark are for convolutions: none in the trace, no such advice.
    no_convs = not any("convolution" in op.name for op in ctx.report.operators)
    ways = (
        [("mixed precision (torch.autocast)", half), ("torch.compile", compiled), ("channels_last for convnets", no_convs),
         ("cudnn.benchmark=True for fixed shapes", no_convs), ("a larger batch per step", False)]
        if ctx.has_device
        else [("torch.compile", compiled), ("bfloat16 autocast on CPUs that support it", half or no_bf16),
              ("channels_last for convnets", no_convs), ("more threads (torch.set_num_threads) if cores are idle", False)]
    )
    left = [way for way, done in ways if not done]
    # Dropout's mask draws run on one thread whatever the threads, compiled or not: said where they cost much.
    dropout = any(f.id == "compute.dropout" for f in ctx.findings)
    unhelped = " None of these speeds up dropout's mask draws (compute.dropout)." if dropout else ""
    emulated = any(f.id == "compute.cpu_half_emulated" for f in ctx.findings)
    already = "; ".join(
        name
        for name, done in (
            ("matmuls already run in FP16/BF16", half and not emulated),
            ("matmuls run in a half precision this CPU has no fast kernels for: see compute.cpu_half_emulated", emulated),
            ("not bfloat16: this CPU has no fast kernels for it", no_bf16 and not half),
            ("the steps already run compiled code", compiled),
        )
        if done
    )
    return (
        "Speed comes from doing the math faster: " + ", ".join(left[:-1]) + f", or {left[-1]}."
        + (f" ({already[:1].upper() + already[1:]}.)" if already else "")
        + unhelped
    )


NEAR_CAPACITY = Threshold(0.9, ">= 90 % of device memory (TB `data.py`)")


@rule(
    "memory.near_capacity",
    "memory",
    NEAR_CAPACITY,
    severity=WARNING,
    fixes=(
        Fix(
            kind="env_var",
            target="PYTORCH_CUDA_ALLOC_CONF",
            value="expandable_segments:True",
            summary="let the caching allocator grow segments instead of fragmenting memory",
        ),
        Fix(
            kind="code_change",
            target="torch.utils.checkpoint",
            value="torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
            summary="recompute activations in backward instead of keeping them",
        ),
    ),
)
def memory_near_capacity(ctx: Context) -> Optional[Verdict]:
    """Peak allocated memory of a GPU close to that GPU's own capacity (the worst such GPU)."""
    ratios = {}
    for device, peak in ctx.report.memory.peak_allocated_bytes.items():
        total = gpu_capacity(ctx.report.device, device)
        if total:
            ratios[device] = (peak / total, peak, total)
    if not ratios:
        return None
    device, (ratio, peak, total) = max(ratios.items(), key=lambda kv: kv[1][0])
    if ratio < NEAR_CAPACITY.value:
        return None
    return Verdict(
        title=f"Peak allocated memory on {device} is {pct(ratio)} of the GPU's capacity",
        share=None,
        evidence={"device": device, "peak_allocated_bytes": peak, "total_memory_bytes": total, "ratio": ratio},
        recommendation="Close to out-of-memory (and allocator retries): use activation checkpointing, mixed precision, "
        "a smaller micro-batch with gradient accumulation, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    )


def gpu_capacity(device: DeviceSummary, label: str) -> Optional[int]:
    """The capacity of the GPU a memory label names (`cuda:3`: the device with id 3 in deviceProperties);
    None for the CPU and other devices, whose capacity the trace does not give. A trace without ids falls
    back to the one capacity it gives."""
    kind, _, index = label.partition(":")
    if kind != "cuda":
        return None
    if index.isdigit() and device.memory_bytes_by_id:
        return device.memory_bytes_by_id.get(int(index))
    return device.total_memory_bytes


MATMUL_TIME_SHARE = 0.2  # below this share of the compute time, the matmuls' rate says little about the run


# Ops that do the math of their family once (callers such as aten::linear or aten::conv2d nest them, so
# counting both would count each FLOP twice); other ops with FLOPs only when none of these has any.
ROOFLINE_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::convolution"})


def matmul_roofline(ctx: Context, compute_seconds: float) -> dict[str, Optional[float]]:
    """Achieved GFLOP/s of the matmul and convolution ops (FLOPs from input shapes over their time) and the
    peak it is compared with: a GPU's datasheet FP32 peak, or on a CPU run the matmul rate measured at
    capture end (manifest environment `cpu_peak`); None where unknown. Empty when those ops take under a
    fifth of the compute time (their rate would say little about the run)."""
    with_flops = [op for op in ctx.report.operators if op.flops]
    rows = [op for op in with_flops if op.name in ROOFLINE_OPS] or with_flops
    seconds = sum((op.device_total_us or op.host_total_us) for op in rows) / 1e6
    if not rows or seconds <= 0 or seconds < MATMUL_TIME_SHARE * compute_seconds:
        return {}
    achieved = sum(op.flops or 0.0 for op in rows) / seconds / 1e9
    peak_gflops: Optional[float] = None
    threads: Optional[int] = None
    if ctx.report.device.present:
        peak = gpu_peak(ctx.report.device.name)
        peak_gflops = 1e3 * peak.fp32_tflops if peak else None
    else:
        # The rate at the run's own intra-op threads (a run limited to 1 thread is compared with 1 thread).
        peak_gflops, threads = ctx.cpu_matmul_peak()
    share = achieved / peak_gflops if peak_gflops else None
    # A CPU's rate is measured once, at capture end: where the run's own matmuls beat it, the check ran at
    # a busier moment (a loaded 2-core VM: 16.8 GFLOP/s there, 25 in the steps) and is no peak to share.
    # Not where half-precision matmuls count in: on a CPU with bfloat16 kernels (AMX) they may beat float32.
    if share is not None and share > 1.0 and not ctx.report.device.present and not ctx.report.measurements.patterns.half_matmuls_per_step:
        share = None
    return {
        "matmul_gflops": achieved,
        "peak_fp32_gflops": peak_gflops,
        "matmul_share_of_fp32_peak": share,
        **({"peak_threads": float(threads)} if threads else {}),
    }


def _roofline_text(roofline: dict[str, Optional[float]], on_gpu: bool) -> str:
    achieved, share = roofline.get("matmul_gflops"), roofline.get("matmul_share_of_fp32_peak")
    if achieved is None:
        return ""
    threads = roofline.get("peak_threads")
    on_threads = f" on {threads:.0f} thread(s)" if threads else ""
    peak = "the FP32 peak" if on_gpu else f"this CPU's FP32 matmul rate{on_threads} measured at capture"
    measured = roofline.get("peak_fp32_gflops")
    if share is None and measured and not on_gpu:
        return (f"; matmuls run at {achieved:,.1f} GFLOP/s, above the {measured:,.1f} GFLOP/s this CPU's FP32 matmul"
                f"{on_threads} reached at capture end (measured at a busier moment: no share of its peak)")
    return f"; matmuls run at {achieved:,.1f} GFLOP/s" + (f" ({pct(share)} of {peak})" if share is not None else "")


CONV_BIAS_BN = Threshold(0, "any convolution with a bias followed by batch_norm (torch.profiler `_pattern_matcher` Conv2dBiasFollowedByBatchNorm2dPattern)")


@rule(
    "compute.conv_bias_before_batch_norm",
    "compute",
    CONV_BIAS_BN,
    fixes=(
        Fix(
            kind="code_change",
            target="torch.nn.Conv2d",
            value="torch.nn.Conv2d(..., bias=False)",
            summary="the batch norm subtracts the mean, so the convolution's bias is computed and then cancelled",
        ),
    ),
)
def compute_conv_bias_before_batch_norm(ctx: Context) -> Optional[Verdict]:
    """Convolutions with a bias right before a batch norm: wasted work (no time estimate)."""
    count = ctx.report.measurements.patterns.conv_bias_before_batch_norm_per_step
    if count <= CONV_BIAS_BN.value:
        return None
    return Verdict(
        title=f"{count:.0f} convolution(s) per step add a bias that the next batch norm cancels",
        share=None,
        evidence={"conv_bias_before_batch_norm_per_step": count},
        recommendation="Create those convolutions with bias=False: batch norm subtracts the mean, which removes the bias.",
    )


HALF_ALIGNMENT = Threshold(0, "any FP16/BF16 matmul with a dimension not a multiple of 8 (torch.profiler `_pattern_matcher` MatMulDimInFP16Pattern)")


@rule(
    "compute.half_matmul_misaligned",
    "compute",
    HALF_ALIGNMENT,
    fixes=(
        Fix(
            kind="code_change",
            target="tensor shapes",
            value="pad hidden sizes, vocabulary and batch to multiples of 8",
            summary="tensor cores run FP16/BF16 GEMMs whose dimensions are multiples of 8",
        ),
    ),
)
def compute_half_matmul_misaligned(ctx: Context) -> Optional[Verdict]:
    """Reduced-precision matmuls with dimensions tensor cores cannot tile (no time estimate; GPU traces:
    tensor cores are a GPU's)."""
    count = ctx.report.measurements.patterns.half_matmuls_misaligned_per_step
    if count <= HALF_ALIGNMENT.value or not ctx.has_device:
        return None
    return Verdict(
        title=f"{count:.0f} FP16/BF16 matmul(s) per step have a dimension that is not a multiple of 8",
        share=None,
        evidence={"half_matmuls_misaligned_per_step": count},
        recommendation="Pad the matrix dimensions (hidden size, vocabulary, batch) to multiples of 8 so tensor cores can run them.",
    )
