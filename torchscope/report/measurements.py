"""Typed measurements: the figures analyses hand to the diagnosis rules, one section per topic.

Each field declares, in its type, how values from several trace files (spans) and ranks combine into the
run's value, so merging is one generic function (`analysis.reduce.merge_sections`) and no figure is
merged by accident of its Python type (a median averaged, a count turned into a mean):

* `PerStep`: a per-step figure; the run's value is the mean over spans weighted by their step counts.
* `Median`: a median; the run's value is the step-weighted median of the spans' medians.
* `Count`: a total; values add up.
* `PerStepByName`: name -> per-step figure; each name's step-weighted mean (a span without the name
  counts as zero), largest first.
* `Names`: a list of names; ordered union.
* `Choice`: one label; the most common one.

A section that does not apply to a span (no kernels, no CPU dispatch figures on a GPU trace) is left out
of the merge for that span rather than counted as zeros.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec


class Merge(enum.Enum):
    """How a measurement combines across spans and ranks (see the module docstring)."""

    MEAN = "mean"
    MEDIAN = "median"
    SUM = "sum"
    KEYED_MEAN = "keyed_mean"
    UNION = "union"
    MODE = "mode"


PerStep = Annotated[float, Merge.MEAN]
Median = Annotated[float, Merge.MEDIAN]
Count = Annotated[float, Merge.SUM]
PerStepByName = Annotated[dict[str, float], Merge.KEYED_MEAN]
Names = Annotated[list[str], Merge.UNION]
Choice = Annotated[str, Merge.MODE]


class Section(msgspec.Struct, kw_only=True):
    """Base of the measurement sections (every field annotated with a `Merge`)."""


class LaunchOverhead(Section):
    """Kernels shorter than the runtime call that launched them (HTA's "short kernels"), and launches that
    wait for their kernel (CUDA_LAUNCH_BLOCKING=1)."""

    kernels_per_step: PerStep = 0.0
    short_kernel_fraction: PerStep = 0.0
    median_kernel_us: Median = 0.0
    median_launch_us: Median = 0.0
    runtime_us_per_step: PerStep = 0.0
    long_kernels_per_step: PerStep = 0.0  # kernels of 20 us or more, linked to their launch
    blocking_launches_per_step: PerStep = 0.0  # of those, launches that returned only after the kernel ended
    # (counts per step, not a fraction: the step-weighted means of both keep their ratio across spans and ranks)
    launch_wait_us_per_step: PerStep = 0.0  # host time inside launch calls while their kernel ran


class Synchronization(Section):
    """Host-blocking device synchronisations inside steps, with the ops and user call sites that cause them."""

    syncs_per_step: PerStep = 0.0
    sync_us_per_step: PerStep = 0.0
    by_op: PerStepByName = {}
    call_sites: PerStepByName = {}


class Copies(Section):
    """Host-to-device copies, and those from pageable (unpinned) memory."""

    htod_per_step: PerStep = 0.0
    htod_us_per_step: PerStep = 0.0
    htod_bytes_per_step: PerStep = 0.0
    pageable_htod_per_step: PerStep = 0.0
    pageable_htod_us_per_step: PerStep = 0.0
    pageable_htod_bytes_per_step: PerStep = 0.0
    pageable_bandwidth_gbps: Median = 0.0


class Optimizer(Section):
    """How `optimizer.step()` is implemented (fused, foreach or a per-parameter loop) and what zero_grad does."""

    optimizers: Names = []
    implementation: Choice = "unknown"
    ops_per_step: PerStep = 0.0
    per_param_ops_per_step: PerStep = 0.0
    foreach_ops_per_step: PerStep = 0.0
    fused_ops_per_step: PerStep = 0.0
    step_us_per_step: PerStep = 0.0
    zero_grad_fill_ops_per_step: PerStep = 0.0
    zero_grad_us_per_step: PerStep = 0.0


class Dispatch(Section):
    """CPU traces: forward/backward time spent in tiny ops and in Python between ops on the main thread."""

    compute_phase_us_per_step: PerStep = 0.0
    ops_per_step: PerStep = 0.0
    tiny_ops_per_step: PerStep = 0.0
    tiny_op_us_per_step: PerStep = 0.0
    python_gap_us_per_step: PerStep = 0.0
    median_op_us: Median = 0.0
    forward_passes_per_step: PerStep = 0.0  # separate stretches of forward time: the model's calls, one per sample in a per-sample loop
    # Matmul units (analysis/arithmetic.py): operators with FLOPs inside no other such operator, their
    # time and FLOPs in forward/backward; of them the large ones (their FLOPs over their time: the rate
    # the what-if keeps the units at), and the units of spans without a large one (no rate in the trace).
    matmul_us_per_step: PerStep = 0.0
    matmul_gflop_per_step: PerStep = 0.0
    matmul_large_us_per_step: PerStep = 0.0
    matmul_large_gflop_per_step: PerStep = 0.0
    matmul_unrated_us_per_step: PerStep = 0.0
    matmul_unrated_gflop_per_step: PerStep = 0.0

    @property
    def matmul_large_gflops(self) -> float:
        """The large units' rate (GFLOP/s; 0 without one)."""
        return self.matmul_large_gflop_per_step / self.matmul_large_us_per_step * 1e6 if self.matmul_large_us_per_step > 0 else 0.0


class OutsideSteps(Section):
    """Host work inside the steps that no phase (data, forward, backward, optimizer) covers, by name."""

    culprits_us_per_step: PerStepByName = {}
    # Of the culprits, the share of the steps each ran in (1.0: every step; periodic work such as an
    # evaluation every N steps runs in fewer).
    culprit_steps_share: PerStepByName = {}
    # Model (nn.Module) calls in that time, at any depth under the culprits: validation, metrics, an EMA or
    # teacher model (a call without gradients after the backward is left unlabelled at capture).
    model_calls_us_per_step: PerStep = 0.0
    # The culprits that ran `aten::_foreach_norm` (gradient clipping on its multi-tensor path), readable names.
    foreach_norm_culprits: Names = []
    # Of the culprits, a training framework's own frames (frames.training_framework): us per step by framework,
    # and their readable names as "framework: name".
    framework_us_per_step: PerStepByName = {}
    framework_culprits: Names = []


class Compile(Section):
    """torch.compile inside the profiled steps (analysis/compilation.py): compiled calls, the time compiling
    (nested compile ranges counted once), and the recompilations among the compilations."""

    compiled_regions_per_step: PerStep = 0.0  # calls of compiled code (`Torch-Compiled Region` ranges)
    compilation_us_per_step: PerStep = 0.0
    compilation_in_compute_us_per_step: PerStep = 0.0  # of it, inside the forward and backward phases
    recompilations_per_step: PerStep = 0.0  # compile ids F/R with R >= 1: a frame compiled again
    recompilation_us_per_step: PerStep = 0.0  # of compilation_us_per_step
    recompiling_steps_share: PerStep = 0.0  # the share of the steps that recompiled
    recompiled_ids: Names = []  # "0/2", "0/3", ...
    varying_inputs: Names = []  # "frame 0, input 0 dim 1: 49, 65, 81": graph input shapes that differ


class DataLoader(Section):
    """DataLoader fetches by iterator kind (num_workers=0 uses the single-process iterator), and batches
    fetched from other iterators."""

    single_process_fetches: Count = 0.0
    multi_process_fetches: Count = 0.0
    # The loop's next() calls that fetch from an iterator that is no DataLoader (a generator, an iterable),
    # and the Python calls they run, by inclusive time (recorded only with stacks).
    iterator_fetches: Count = 0.0
    iterator_frames_us_per_step: PerStepByName = {}
    # The loop's waits for a batch on a queue (`queue.Queue.get`, multiprocessing's) that a producer fills.
    queue_waits: Count = 0.0
    # Per run, from the capture's step clock (analysis/loader_restarts.py; 0 steps: not timed): the worker
    # processes' turnover in the unprofiled steps (start, first fetch, shutdown at the epoch's end).
    unprofiled_steps: Count = 0.0
    unprofiled_step_mean_us: Median = 0.0  # the mean: an epoch's turnover is one step in many
    worker_restarts_per_step: Median = 0.0
    restart_us_per_step: Median = 0.0  # the turnover the clock timed, averaged over every unprofiled step
    restart_first_fetch_us_per_step: Median = 0.0  # of it, the restarted iterators' first fetch (its batch included)
    restart_step_excess_us_per_step: Median = 0.0  # the steps holding one, beyond the median of the others


class DeviceIdle(Section):
    """Device idle time inside the steps, the part the host spent loading data or blocked in a sync, and
    the host ops that ran while the device idled."""

    idle_us_per_step: PerStep = 0.0
    explained_us_per_step: PerStep = 0.0
    host_ops_us_per_step: PerStepByName = {}


class Savings(Section):
    """Step time a fix would save, per modelled cause (data_loading, optimizer_step, optimizer_step_fused (CPU),
    zero_grad, outside_steps, launch, sync), as a pessimistic and an optimistic figure (analysis/whatif.py).

    `model` says how: "device_replay" (GPU traces: the step replayed with the cause shrunk) or
    "host_critical_path" (CPU traces: the cause's main-thread time). `modelled_step_us` is the replayed
    baseline, to compare with `measured_step_us` (the model's error)."""

    model: Choice = "none"
    saved_us_per_step_low: PerStepByName = {}
    saved_us_per_step_high: PerStepByName = {}
    modelled_step_us: PerStep = 0.0
    measured_step_us: PerStep = 0.0


class Patterns(Section):
    """Anti-patterns of torch.profiler's pattern matcher measured on their own (analysis/patterns.py)."""

    conv_bias_before_batch_norm_per_step: PerStep = 0.0
    half_matmuls_misaligned_per_step: PerStep = 0.0
    half_matmuls_per_step: PerStep = 0.0  # matmuls with FP16/BF16 inputs (autocast or a half model), aligned or not
    # CPU traces: the host time and GFLOPs (from shapes) of the matmul kernels' ops (aten::mm, addmm, bmm,
    # baddbmm) by the dtype they compute in ("bfloat16", "float16").
    half_matmul_us_per_step: PerStepByName = {}
    half_matmul_gflop_per_step: PerStepByName = {}
    indexing_loop_iterations_per_step: PerStep = 0.0  # `for i in ...: t[i] = ...` iterations (>= 10 in a row)
    indexing_loop_us_per_step: PerStep = 0.0  # host time of those iterations
    indexing_loop_compute_us_per_step: PerStep = 0.0  # of it, inside forward/backward
    extra_device_copies_per_step: PerStep = 0.0  # tensors filled on the CPU, then copied to the device
    extra_device_copy_us_per_step: PerStep = 0.0  # host time of those copies (`aten::to`)
    # Recurrent cells called one time step at a time (`aten::lstm_cell`, `gru_cell`, `rnn_tanh_cell`,
    # `rnn_relu_cell`): nn.LSTMCell & co. in a Python loop over the sequence.
    recurrent_cells_per_step: PerStep = 0.0
    recurrent_cell: Choice = ""


class Memory(Section):
    """Allocator figures per device label (`cpu`, `cuda:0`) for the memory rules (analysis/memory.py):
    growth of the allocated total across steps, churn inside steps, the reserved-allocated gap at the
    peak, and cudaMalloc/cudaFree calls inside steps."""

    growth_bytes_per_step: PerStepByName = {}
    growth_r2: PerStepByName = {}
    growth_steps: PerStepByName = {}  # step boundaries the slope was fitted on
    leak_sites_bytes_per_step: PerStepByName = {}  # call site -> bytes per step that outlive their step
    # Where the trace lacks frees (memory_blocks.py): blocks per step shown freed by a later allocation at
    # their address, and never-freed bytes per step perhaps freed unseen; the line the leak rule judges
    # (MemoryGrowth.leak_*: without those blocks where the allocator counts only recorded events).
    unrecorded_frees_per_step: PerStepByName = {}
    doubtful_bytes_per_step: PerStepByName = {}
    leak_growth_bytes_per_step: PerStepByName = {}
    leak_growth_r2: PerStepByName = {}
    churn_bytes_per_step: PerStepByName = {}  # allocated and freed inside the step, outside forward/backward
    churn_allocations_per_step: PerStepByName = {}
    churn_sites_bytes_per_step: PerStepByName = {}
    peak_allocated_bytes: PerStepByName = {}
    peak_reserved_bytes: PerStepByName = {}
    allocator_calls_per_step: PerStep = 0.0  # cudaMalloc/cudaFree (and HIP's) inside steps
    allocator_us_per_step: PerStep = 0.0
    cache_releases_per_step: PerStep = 0.0  # of them, frees outside any operator: torch.cuda.empty_cache()


class ProfilerOverhead(Section):
    """What recording cost per phase (analysis/overhead.py): events recorded per phase and step (per
    span), then, for the run, the capture's unprofiled and profiled step medians and the phase shares
    without the overhead (`method`: "fetch_clock", "step_clock", "negligible" or "not_measured")."""

    python_events_per_step: PerStepByName = {}
    ops_per_step: PerStepByName = {}
    own_us_per_step: PerStepByName = {}  # torchscope's own step calls by phase
    phase_median_us: PerStepByName = {}  # each phase's median per step (robust to one descheduled step)
    # Each phase's time inside the ranges the capture's phase clock times, "<clocked phase>:<phase>" (the
    # clock's backward holds DDP's all-reduces, which the trace's partition gives to communication).
    within_clocked_us_per_step: PerStepByName = {}
    method: Choice = "not_measured"
    unprofiled_steps: Count = 0.0
    profiled_steps: Count = 0.0
    unprofiled_step_us: Median = 0.0
    profiled_step_us: Median = 0.0
    overhead_us_per_step: PerStep = 0.0
    overhead_us_by_phase: PerStepByName = {}
    corrected_percent: PerStepByName = {}
    slowdown_by_phase: PerStepByName = {}
    # Traces thinned to their size budget at capture (capture/thinning.py): their shortest Python calls dropped.
    thinned_traces: Names = []
    python_events_recorded: Count = 0.0  # in the thinned traces, kept and dropped
    python_events_dropped: Count = 0.0
    dropped_python_us: Count = 0.0  # the dropped calls' own total time (inside their kept callers' time)
    kept_python_longer_than_us: Median = 0.0  # the thinned traces' duration threshold
    trace_budget_mb: Median = 0.0


class Getitem(Section):
    """Main-process `__getitem__` frames (num_workers=0) and their costliest direct calls by readable
    name, inclusive recorded time per step (analysis/getitem.py)."""

    frames: Names = []
    calls_per_step: PerStep = 0.0
    getitem_us_per_step: PerStep = 0.0
    calls_us_per_step: PerStepByName = {}
    # The batch's collate_fn (a user's `collate`, torch's `default_collate`), called by the DataLoader's
    # fetch after the __getitem__ calls: inclusive recorded time per step, by readable name.
    collate_us_per_step: PerStepByName = {}


class StepTime(Section):
    """How much the step time varies, and how sure its mean is (pipeline/step_spread.py, run-level): over
    the recorded steps (every rank's), and over the capture's unprofiled steps when the manifest has them.
    `ci_*`: Student's t interval of the mean at `confidence`; `*_half_percent`: its half-width over the mean."""

    steps: Count = 0.0
    mean_us: Median = 0.0
    median_us: Median = 0.0
    stdev_us: Median = 0.0
    cv_percent: Median = 0.0  # stdev over mean
    confidence: Median = 0.0
    ci_low_us: Median = 0.0
    ci_high_us: Median = 0.0
    ci_half_percent: Median = 0.0
    steps_for_10_percent: Median = 0.0  # recorded steps whose mean this cv would know within ±10 % (0: n/a)
    unprofiled_steps: Count = 0.0
    unprofiled_mean_us: Median = 0.0
    unprofiled_cv_percent: Median = 0.0
    unprofiled_ci_half_percent: Median = 0.0


# The `Synchronization.by_op` names of the syncs inside anomaly mode's NaN checks (their `.item()`) and
# inside the user's module hooks: each is its own finding's time.
ANOMALY_CHECK = "anomaly mode's NaN checks"
MODULE_HOOK_SYNCS = "module hooks"


class AnomalyMode(Section):
    """Autograd's anomaly detection left on (analysis/anomaly.py): its NaN checks after each backward node,
    and the Python stacks it saves for each node the forward creates (seen only with stacks recorded)."""

    nan_checks_per_step: PerStep = 0.0  # outputs checked (one `aten::isnan` each)
    nan_check_us_per_step: PerStep = 0.0  # host time of the checks (isnan, _is_any_true, item: its sync too)
    stack_captures_per_step: PerStep = 0.0  # `torch.fx.traceback.format_stack` called from an operator
    stack_capture_us_per_step: PerStep = 0.0


class GarbageCollection(Section):
    """Python's garbage collections (analysis/garbage_collection.py): inside the recorded steps, from the
    "Python GC" events of a capture with stacks (defaults where the trace holds none); and, per run, in the
    unprofiled steps the capture's clock timed (`unprofiled_*`, from the manifest; 0 steps: not timed)."""

    collections_per_step: PerStep = 0.0
    explicit_collections_per_step: PerStep = 0.0  # of them, the script's own gc.collect() calls
    gc_us_per_step: PerStep = 0.0
    long_pauses_per_step: PerStep = 0.0  # collections of 1 ms or more
    longest_pause_us: Median = 0.0  # the longest in a span; the run's: the spans' median
    unprofiled_steps: Count = 0.0
    unprofiled_step_mean_us: Median = 0.0  # the mean, not the median: a rare full collection is the point
    unprofiled_gc_us_per_step: Median = 0.0  # all generations
    unprofiled_full_gc_us_per_step: Median = 0.0  # full collections (generation 2)
    unprofiled_collections_per_step: Median = 0.0
    unprofiled_longest_pause_us: Median = 0.0  # over every collection the clock timed


class Recompute(Section):
    """Activation checkpointing's recomputation (analysis/recompute.py): the outermost module calls inside
    the backward phase, their time per step (host time on a CPU, their kernels' device time on a GPU)."""

    recomputed_calls_per_step: PerStep = 0.0
    recompute_us_per_step: PerStep = 0.0
    bookkeeping_us_per_step: PerStep = 0.0  # checkpoint's own Python outside the modules (with stacks; host)
    modules_us_per_step: PerStepByName = {}
    time_base: Choice = "host"  # "device" on GPU traces


class ModuleHooks(Section):
    """Hooks the user's code registered on modules, from the recorded stacks (analysis/module_hooks.py):
    their calls and inclusive time per step, by hook."""

    calls_per_step: PerStep = 0.0
    hooks_us_per_step: PerStep = 0.0
    hooks_us_by_name: PerStepByName = {}


class GradientSync(Section):
    """Gradient accumulation under data parallelism (analysis/grad_sync.py): forward passes (micro-steps) per
    step, how many of them synchronised the gradients in their backward (the wrapper's gradient hooks), how
    many of those were synchronised again before an optimizer step (redundant: `no_sync()` on the first
    micro-steps), and the gradient collectives' time."""

    wrapper: Choice = ""  # "DistributedDataParallel", "FullyShardedDataParallel", "fully_shard" or ""
    micro_steps_per_step: PerStep = 0.0
    syncing_micro_steps_per_step: PerStep = 0.0
    # Syncing micro-steps whose gradients were synchronised again before an optimizer step read them.
    redundant_micro_steps_per_step: PerStep = 0.0
    sync_us_per_step: PerStep = 0.0  # the gradient collectives' wall time
    sync_exposed_us_per_step: PerStep = 0.0  # of it, not overlapped by compute
    redundant_sync_us_per_step: PerStep = 0.0  # the redundant micro-steps' part of it
    redundant_exposed_us_per_step: PerStep = 0.0
    collective_exposed_us_per_step: PerStep = 0.0  # every all-reduce and reduce-scatter, not overlapped by compute


class DataParallel(Section):
    """The data-parallel wrapper a rank's forward ranges name (analysis/grad_sync.py), which decides what a
    communication fix looks like: DDP's buckets and comm hooks, FSDP's prefetching and resharding."""

    wrapper: Choice = ""  # "DistributedDataParallel", "FullyShardedDataParallel" (FSDP1), "fully_shard" (FSDP2)
    units_per_forward: Median = 0.0  # FSDP: sharded units a forward pass all-gathers (1: the whole model at once)


class Float64(Section):
    """Operators computing in float64 (analysis/float64.py): those with a double tensor input, from the
    input types recorded with shapes, and their own time per step (host self time on a CPU, their kernels'
    device time on a GPU, `time_base`), beside all typed ops' own time."""

    time_base: Choice = "host"
    ops_per_step: PerStep = 0.0
    float64_us_per_step: PerStep = 0.0
    typed_ops_us_per_step: PerStep = 0.0  # every op with recorded input types, the same way
    by_op: PerStepByName = {}


class PhaseClock(Section):
    """Run level, from the capture's phase clock (analysis/phase_clock.py): each compute phase's median and
    fastest tenth over the unprofiled steps it ran in, and the median excess summed over them; the CPU the
    main process used per wall second outside its fetches (`compute_cpu_per_wall`) and its children (the
    DataLoader workers) used in the recorded window (`children_cpu_per_wall`; 0: not recorded)."""

    unprofiled_steps: Count = 0.0
    step_median_us: Median = 0.0
    median_us: PerStepByName = {}
    fastest_us: PerStepByName = {}
    excess_us_per_step: PerStep = 0.0
    compute_cpu_per_wall: Median = 0.0
    children_cpu_per_wall: Median = 0.0  # the process tree's CPU beyond the training process (its workers)


class Dropout(Section):
    """Dropout on CPU traces (analysis/dropout.py): the outermost dropout operators in the steps, and the
    random mask draws inside them (`aten::bernoulli_`: one thread, whatever the intra-op threads)."""

    calls_per_step: PerStep = 0.0
    dropout_us_per_step: PerStep = 0.0  # host time, the mask's multiply included
    mask_us_per_step: PerStep = 0.0  # of it, drawing the masks


class Embeddings(Section):
    """Large embedding tables (a million values or more) looked up in the steps (analysis/embeddings.py):
    their lookups per step, which get dense gradients, and the time spent on whole dense tables outside
    the forward (the dense backward, zero_grad's fill, the optimizer's passes over table and moments)."""

    tables: Names = []  # "1000000x64"
    lookups_per_step: PerStepByName = {}  # table -> indices looked up per step: at most that many rows touched
    dense_tables: Names = []
    dense_update_us_per_step: PerStep = 0.0  # host time, or the kernels' device time where time_base is "device"
    time_base: Choice = "host"


class Attention(Section):
    """Attention computed op by op (analysis/attention.py): softmaxes over score tensors (a matmul's product
    and another's left operand) outside `scaled_dot_product_attention`, and the time of the ops on those
    score tensors, matmuls and dropout excepted: what fused attention would not spend."""

    calls_per_step: PerStep = 0.0
    score_shapes: Names = []  # "64x256x256": batch x heads, queries, keys
    score_us_per_step: PerStep = 0.0  # own time: host self time, or the kernels' device time where time_base is "device"
    need_weights_calls_per_step: PerStep = 0.0  # of the calls, in nn.MultiheadAttention's need_weights path
    calls_with_stacks_per_step: PerStep = 0.0  # of the calls, those under a recorded Python frame (else: caller unknown)
    dropout_calls_per_step: PerStep = 0.0  # dropout with p > 0 on the scores (attention dropout)
    dropout_p_unknown_calls_per_step: PerStep = 0.0  # dropout on the scores, p not recorded (no concrete inputs)
    fused_calls_per_step: PerStep = 0.0  # scaled_dot_product_attention calls beside them
    time_base: Choice = "host"


class GraphBreaks(Section):
    """torch.compile graph breaks in training (analysis/graph_breaks.py): compiled graphs (`CompiledFunction`)
    and compiled calls (outermost compiled regions holding one) per step, the breaks between, where they are
    (dynamo's resume functions, with stacks) and the time between graphs."""

    graphs_per_step: PerStep = 0.0
    compiled_calls_per_step: PerStep = 0.0
    breaks_per_step: PerStep = 0.0
    between_graphs_us_per_step: PerStep = 0.0  # host time, or on a GPU the device's idle time in it
    locations: PerStepByName = {}  # "forward (train.py:9)": resumes per step
    time_base: Choice = "host"  # "device_idle" on GPU traces
    ddp_forwards_per_step: PerStep = 0.0  # DDP's forward ranges: its DDPOptimizer splits graphs per bucket


class Measurements(msgspec.Struct, kw_only=True):
    """Every measurement section of a run (each at its defaults when no span had it)."""

    launch: LaunchOverhead = msgspec.field(default_factory=LaunchOverhead)
    sync: Synchronization = msgspec.field(default_factory=Synchronization)
    copies: Copies = msgspec.field(default_factory=Copies)
    optimizer: Optimizer = msgspec.field(default_factory=Optimizer)
    dispatch: Dispatch = msgspec.field(default_factory=Dispatch)
    outside_steps: OutsideSteps = msgspec.field(default_factory=OutsideSteps)
    compile: Compile = msgspec.field(default_factory=Compile)
    dataloader: DataLoader = msgspec.field(default_factory=DataLoader)
    idle: DeviceIdle = msgspec.field(default_factory=DeviceIdle)
    savings: Savings = msgspec.field(default_factory=Savings)
    patterns: Patterns = msgspec.field(default_factory=Patterns)
    memory: Memory = msgspec.field(default_factory=Memory)
    profiler_overhead: ProfilerOverhead = msgspec.field(default_factory=ProfilerOverhead)
    getitem: Getitem = msgspec.field(default_factory=Getitem)
    anomaly: AnomalyMode = msgspec.field(default_factory=AnomalyMode)
    gc: GarbageCollection = msgspec.field(default_factory=GarbageCollection)
    recompute: Recompute = msgspec.field(default_factory=Recompute)
    dropout: Dropout = msgspec.field(default_factory=Dropout)
    embeddings: Embeddings = msgspec.field(default_factory=Embeddings)
    attention: Attention = msgspec.field(default_factory=Attention)
    module_hooks: ModuleHooks = msgspec.field(default_factory=ModuleHooks)
    grad_sync: GradientSync = msgspec.field(default_factory=GradientSync)
    data_parallel: DataParallel = msgspec.field(default_factory=DataParallel)
    float64: Float64 = msgspec.field(default_factory=Float64)
    phase_clock: PhaseClock = msgspec.field(default_factory=PhaseClock)
    graph_breaks: GraphBreaks = msgspec.field(default_factory=GraphBreaks)
    step_time: StepTime = msgspec.field(default_factory=StepTime)


SECTION_TYPES: dict[str, type[Section]] = {f.name: f.type for f in msgspec.structs.fields(Measurements)}
