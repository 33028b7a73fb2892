"""Input pipeline rules: data loading and host-to-device copies.

The data-loading advice fits the machine the capture ran on (the manifest's environment: CPUs per rank,
intra-op threads, the DataLoader's settings, whether the process waited or computed) and names the
costliest calls of ``__getitem__`` when the recorded stacks hold them (docs/rules.md)."""

from __future__ import annotations

import math
from typing import Any, Optional

import msgspec

from torchscope.diagnose.context import Context, as_int, ms, pct
from torchscope.diagnose.rule import Threshold, Verdict, by_share, rule
from torchscope.diagnose.rules_quality import stated_step_us, unprofiled_share
from torchscope.report.model import Fix, FixValue
from torchscope.rundir.contention import OTHERS_BUSY_SHARE, oversubscribed

DATA_LOADING = Threshold(0.05, "warning above 5 % of the step (TB `data.py`: `dataloader_ratio > 0.05`)")
MAX_SUGGESTED_WORKERS = 8  # more workers rarely help one GPU and multiply host memory
WAITING_CPU_PER_WALL = 0.5  # the process ran on a CPU less than half the window: its loading waits (I/O, sleep)
WAITING_FETCH_CPU = 0.35  # the fetches used a CPU under 35 % of their time: they wait, they do not compute
MIN_GAIN = 0.05  # a thread-for-worker trade is advised only when the model predicts >= 5 % of the step
RECEIVE_KEPT = 0.25  # pessimistic share of loading left on the main process with workers (analysis/whatif.KEPT)

PIN_MEMORY = Fix(
    kind="dataloader_kwarg",
    target="pin_memory",
    value=True,
    summary="batches in page-locked memory: host-to-device copies run at full bandwidth and can be asynchronous",
)
NON_BLOCKING = Fix(
    kind="code_change",
    target="Tensor.to",
    value="batch.to(device, non_blocking=True)",
    summary="copy without making the host wait (the source must be pinned)",
)


class Machine(msgspec.Struct, frozen=True):
    """What the advice has to fit: CPUs per rank, the intra-op threads compute uses, the loader's workers,
    and what the main process's fetches and the rest of its step cost in CPU (capture step clock)."""

    cores_per_rank: Optional[int]  # None: the CPU count was not recorded
    threads: int  # intra-op threads compute runs on (capped at the cores)
    workers: Optional[int]  # the DataLoader's num_workers (None: unknown)
    device: bool  # compute runs on an accelerator (the host's threads then mostly launch)
    waiting: bool  # the loading waits (I/O, sleep) rather than computes: workers need no core of their own
    fetch_cpu_per_wall: Optional[float] = None  # CPU seconds per wall second of the main-process fetches
    compute_cpu_per_wall: Optional[float] = None  # the same for the rest of the step (compute)

    @property
    def spare_cores(self) -> Optional[int]:
        """Cores a worker can have without taking one from compute (the main process keeps one)."""
        if self.cores_per_rank is None:
            return None
        used = 1 if self.device else max(self.threads, 1)
        return max(self.cores_per_rank - used, 0)

    @property
    def fetch_threads(self) -> float:
        """Threads a fetch keeps busy in the main process: its CPU/wall, at most the intra-op threads, at
        least 1 (a waiting fetch still needs its wall time). A worker runs one intra-op thread (torch sets it
        in each worker), so a fetch costs a worker up to this many times its main-process wall time."""
        if self.fetch_cpu_per_wall is None or self.waiting:
            return 1.0  # not recorded: a worker fetches as fast as the main process (no better guess)
        return min(max(self.fetch_cpu_per_wall, 1.0), float(max(self.threads, 1)))

    @property
    def compute_threads(self) -> float:
        """Threads compute keeps busy: its CPU/wall where recorded, at most the intra-op threads (1 on an
        accelerator, whose host thread mostly launches, when not recorded)."""
        if self.compute_cpu_per_wall is not None:
            return min(max(self.compute_cpu_per_wall, 1.0), float(max(self.threads, 1)))
        return 1.0 if self.device else float(max(self.threads, 1))


class Advice(msgspec.Struct, frozen=True):
    """The data-loading advice: workers (None: none advised), threads to give compute (None: unchanged),
    the predicted step (us) and the reason, in words."""

    workers: Optional[int]
    threads: Optional[int]
    predicted_step_us: Optional[float]
    reason: str


def predict_step(machine: Machine, data_us: float, step_us: float, workers: int, threads: int) -> float:
    """The step (us) with `workers` DataLoader workers and compute on `threads` intra-op threads, for a
    loading that computes: the slowest of compute on its threads, a worker's batch over the workers, and
    all the CPU work (the fetch's as measured, compute's) spread over the rank's cores."""
    compute_us = max(step_us - data_us, 1.0)
    busy = machine.compute_threads
    compute_wall = compute_us * max(busy / max(threads, 1), 1.0)  # fewer threads than it kept busy: slower
    worker_batch = data_us * machine.fetch_threads  # one thread does what `fetch_threads` did
    cpu_work = compute_us * busy + data_us * machine.fetch_threads
    cores = machine.cores_per_rank or 1
    return max(compute_wall, worker_batch / max(workers, 1), cpu_work / cores)


def advise(machine: Machine, data_us: float, step_us: float) -> Advice:
    """Workers that fit the machine, advised only where the predicted step is faster (docs/rules.md).

    Loading that waits (sleep, I/O) overlaps in workers without cores, so more workers than cores can be
    right. Loading that computes is priced from the fetch's own CPU time: a worker runs one intra-op
    thread, so a fetch that kept `fetch_threads` threads busy in the main process costs a worker that many
    times its wall time; workers get only cores free of compute's threads (oversubscribed, compute's
    OpenMP threads stall: measured on the demo, 2 cores, 2 workers made forward 5 -> 14 ms), and all the
    work must fit the rank's cores. Giving compute fewer threads is tried where it frees a core."""
    compute_us = max(step_us - data_us, 1.0)
    needed = max(math.ceil(data_us / compute_us), 1)  # waiting workers that keep up
    wanted = min(max(2 * needed, 2), MAX_SUGGESTED_WORKERS)  # a margin: IPC, uneven samples
    spare = machine.spare_cores
    if machine.workers is None:  # several workers, how many was not recorded: no number to raise it to
        free = f"; {spare} core(s) are free for workers" if spare else ""
        return Advice(None, None, None, f"its num_workers was not recorded{free}")
    current = machine.workers
    if machine.waiting:
        workers = max(wanted, 2 * current) if current else wanted
        workers = min(workers, MAX_SUGGESTED_WORKERS)
        if workers <= current:
            return Advice(None, None, None, f"the loading waits (I/O or sleep) and num_workers={current} is already the cap")
        cores = machine.cores_per_rank
        beyond = (f"; more workers than the {cores} core(s) is right here, since a waiting worker uses "
                  "almost no CPU (torch's warning about a suggested maximum counts cores)") if cores and workers > cores else ""
        return Advice(workers, None, max(compute_us, data_us / workers),
                      "the loading mostly waits (its fetches used a CPU a fraction of their time): workers "
                      f"overlap the waits without needing cores{beyond}")
    if spare is None:
        return Advice(None if current else wanted, None, None, "the CPU count was not recorded")
    if current:  # workers that do not keep up: more, on the cores free of compute
        workers = min(wanted, spare)
        if workers <= current:
            if spare == 0:
                return Advice(None, None, None, f"no core is free beside compute's {machine.threads} intra-op "
                              f"thread(s) on {machine.cores_per_rank} core(s), and num_workers={current} already compete with it")
            return Advice(None, None, None, f"num_workers={current} already uses the {spare} core(s) free beside compute")
        return Advice(workers, None, max(compute_us, data_us / workers), f"{spare} core(s) are free beside compute")
    return _advise_computing(machine, data_us, step_us)


def _advise_computing(machine: Machine, data_us: float, step_us: float) -> Advice:
    """num_workers=0 and a loading that computes: the (workers, threads) with the fastest predicted step,
    advised only when it beats the step by MIN_GAIN."""
    cores = machine.cores_per_rank or 1
    options = []  # (predicted, -threads, workers): fastest, then more threads kept, then fewer workers
    for threads in ([machine.threads] if machine.device else range(machine.threads, 0, -1)):
        free = cores - (1 if machine.device else threads)
        for workers in range(1, min(free, MAX_SUGGESTED_WORKERS) + 1):
            options.append((predict_step(machine, data_us, step_us, workers, threads), -threads, workers))
    fetch = _fetch_words(machine, data_us)
    if not options:
        return Advice(None, None, None, f"all {cores} core(s) run compute's {machine.threads} intra-op thread(s) "
                      f"and a worker would take its core from compute{fetch}")
    best = min(options)[0]
    predicted, negative_threads, workers = min(o for o in options if o[0] <= best * 1.01)
    threads = -negative_threads
    if predicted > (1 - MIN_GAIN) * step_us:
        return Advice(None, None, None, f"a worker would take its core from compute{fetch}: the best choice on "
                      f"{cores} core(s) ({workers} worker(s), {threads} intra-op thread(s)) predicts a step of "
                      f"{ms(predicted)} against {ms(step_us)} now")
    workers = min(2 * workers, cores - (1 if machine.device else threads), MAX_SUGGESTED_WORKERS)  # margin
    if threads == machine.threads:
        beside = "the main process" if machine.device else f"compute's {threads} intra-op thread(s)"
        return Advice(workers, None, predicted, f"{cores - (1 if machine.device else threads)} core(s) are free beside {beside}{fetch}")
    return Advice(workers, threads, predicted,
                  f"all {cores} cores run compute's intra-op threads: giving {machine.threads - threads} of them "
                  f"to workers pays because loading ({ms(data_us)}) is longer than compute "
                  f"({ms(max(step_us - data_us, 1.0))}){fetch}")


def _fetch_words(machine: Machine, data_us: float) -> str:
    """What a worker's batch costs, in words, where the fetch kept more than one thread busy."""
    if machine.fetch_threads <= 1.05:
        return ""
    return (f"; a fetch keeps {machine.fetch_threads:.1f} threads busy in the training process (CPU/wall), and a "
            f"worker runs one intra-op thread, so a batch could take a worker up to "
            f"{ms(data_us * machine.fetch_threads)}")


@rule(
    "data_loading.exposed",
    "data_loading",
    DATA_LOADING,
    severity=by_share(DATA_LOADING.value),
    fixes=(
        Fix(
            kind="dataloader_kwarg",
            target="num_workers",
            summary="load batches in worker processes: as many as there are cores free of compute (or, when "
            "loading waits on I/O, enough to overlap it), at most 8",
        ),
        Fix(
            kind="torch_flag",
            target="torch.set_num_threads",
            summary="give up an intra-op thread so that the DataLoader worker has a core",
        ),
        PIN_MEMORY,
        Fix(kind="dataloader_kwarg", target="persistent_workers", value=True, summary="keep workers alive across epochs"),
        Fix(kind="dataloader_kwarg", target="prefetch_factor", value=2, summary="batches each worker prepares ahead"),
        Fix(
            kind="code_change",
            target="Dataset.__getitem__",
            summary="make the costliest calls of __getitem__ cheaper (precompute, cache, vectorise over the batch)",
        ),
        Fix(
            kind="code_change",
            target="collate_fn",
            summary="keep the collate_fn to stacking tensors: tokenize, pad or decode per sample in the dataset, or ahead of time",
        ),
        Fix(
            kind="code_change",
            target="torch.utils.data.DataLoader",
            value="DataLoader(MyIterableDataset(), batch_size=None, num_workers=N)",
            summary="fetch the batches a plain iterator (a generator) makes through a DataLoader over an "
            "IterableDataset, so that worker processes prepare them",
        ),
    ),
)
def data_loading_exposed(ctx: Context) -> Optional[Verdict]:
    """Exposed data-loading time: the part of the step where the loop waits for the next batch and the
    device (if any) has nothing to do. The advice fits the machine and the loader (``advise``)."""
    exposed = ctx.breakdown_share("data_loading")
    if exposed <= 0:
        return None
    share, share_range = ctx.cost("data_loading", exposed)
    corrected = unprofiled_share(ctx, "data_loading")
    if corrected is not None and exposed > 0:  # the profiler inflates Python-heavy loading (analysis/overhead.py)
        scale = min(corrected / exposed, 1.0)
        share, share_range = share * scale, (share_range[0] * scale, share_range[1] * scale)
        exposed = min(corrected, exposed)
    step_us = stated_step_us(ctx)
    exposed_us = exposed * step_us
    loader = ctx.report.measurements.dataloader
    settings = ctx.main_loader()
    # Batches from the loop's own iterator (a generator), with no DataLoader fetch: loaded in the training
    # process, as with num_workers=0.
    no_loader = not (loader.single_process_fetches or loader.multi_process_fetches or settings)
    iterator = no_loader and loader.iterator_fetches > 0
    # Waits on a queue a producer (thread or process) fills: no DataLoader's worker model to advise from.
    queue = no_loader and not iterator and loader.queue_waits > 0
    single = loader.single_process_fetches > 0 or settings.get("num_workers") == 0 or iterator
    machine = _machine(ctx, settings, single)
    advice = advise(machine, exposed_us, step_us)
    if not ctx.has_device and advice.predicted_step_us is not None and step_us > 0 and not queue:
        share, share_range = _advised_saving(advice, exposed_us, step_us)
    collate = _costly_collate(ctx)
    # A collate_fn that holds nearly all of the fetch: __getitem__ is not where the time goes.
    getitem_matters = collate is None or collate[2] <= 1.0 - COLLATE_SHARE
    culprits = _iterator_culprits(ctx) if iterator else _getitem_culprits(ctx) if getitem_matters else ""
    if queue:
        title = f"Data loading blocks the step for {ms(exposed_us)}: the loop waits for its batches on a queue"
    elif iterator:
        title = f"Data loading blocks the step for {ms(exposed_us)}: the loop makes its batches itself (no DataLoader)"
    elif single:
        title = f"Data loading blocks the step for {ms(exposed_us)} with num_workers=0"
    else:
        title = f"Data loading is exposed: the step waits {ms(exposed_us)} for batches"
    targets: list[str] = ["torch.utils.data.DataLoader"] if iterator or queue else []
    values: dict[str, FixValue] = {}
    if not queue:  # a DataLoader's keywords: not for a producer of the user's own
        _add_loader_fixes(targets, values, advice, machine, settings, ctx.has_device)
    if culprits and not iterator:
        targets.append("Dataset.__getitem__")
        values["Dataset.__getitem__"] = culprits
    if collate is not None and not (iterator or queue):
        targets.append("collate_fn")
        values["collate_fn"] = collate[0]
    return Verdict(
        title=title,
        share=share,
        evidence={
            "exposed_us_per_step": exposed_us,
            "data_loading_us_per_step_incl_hidden": ctx.phase_share("data_loading") * ctx.mean_step_us,
            "num_workers_zero": single,
            "multi_process_loader": loader.multi_process_fetches > 0,
            **({"iterator_fetches": loader.iterator_fetches} if iterator else {}),
            **({"queue_waits": loader.queue_waits} if queue else {}),
            "cpu_count": as_int(ctx.environment().get("cpu_count")),
            "cores_per_rank": machine.cores_per_rank,
            "num_workers": machine.workers,
            "intra_op_threads": as_int(ctx.environment().get("torch_num_threads")),
            "loading_waits": machine.waiting,
            "predicted_step_us": advice.predicted_step_us,
        },
        recommendation=_QUEUE_TEXT if queue else _iterator_text(advice, culprits) if iterator
        else _text(advice, machine, settings, culprits, ctx.has_device, getitem_matters) + _collate_text(collate),
        fix_values=values,
        fix_targets=tuple(targets),
        share_range=share_range,
    )


def _add_loader_fixes(
    targets: list[str], values: dict[str, FixValue], advice: Advice, machine: Machine, settings: dict[str, Any], device: bool
) -> None:
    """The DataLoader keywords (and thread count) the advice sets, as fix targets and values."""
    if advice.workers is not None:
        targets.append("num_workers")
        values["num_workers"] = advice.workers
        if advice.threads is not None:
            targets.append("torch.set_num_threads")
            values["torch.set_num_threads"] = advice.threads
        if device and not settings.get("pin_memory"):
            targets.append("pin_memory")  # pin_memory only helps (and torch only accepts it quietly) with a device
        if not settings.get("persistent_workers") and settings.get("iterations", 2) > 1:
            targets.append("persistent_workers")
        if machine.waiting and machine.workers:
            targets.append("prefetch_factor")
            values["prefetch_factor"] = 4
    elif device and not settings.get("pin_memory"):
        targets.append("pin_memory")


def _advised_saving(advice: Advice, data_us: float, step_us: float) -> tuple[float, tuple[float, float]]:
    """CPU runs: what the advised workers save, from the step the advice predicts (the main thread is
    the critical path; the advice knows the cores workers get, whether loading waits, and what a thread
    given up costs compute). High: the advised steady state; low: the main process also keeps
    `RECEIVE_KEPT` of the loading (it still takes each batch off the queue and rebuilds its tensors)."""
    predicted = advice.predicted_step_us or step_us
    compute_us = max(step_us - data_us, 0.0)
    high = max(step_us - predicted, 0.0) / step_us
    low = max(step_us - max(predicted, compute_us + RECEIVE_KEPT * data_us), 0.0) / step_us
    return (low + high) / 2.0, (min(low, high), high)


def _machine(ctx: Context, settings: dict[str, Any], single: bool) -> Machine:
    environment = ctx.environment()
    cpus = as_int(environment.get("cpu_count"))
    ranks = max(as_int(environment.get("local_world_size")) or 1, 1)
    cores = max(cpus // ranks, 1) if cpus else None
    threads = as_int(environment.get("torch_num_threads")) or cores or 1
    workers = as_int(settings.get("num_workers"))
    if workers is None and single:
        workers = 0
    fetch, rest = _cpu_per_wall(environment, min(threads, cores) if cores else threads)
    return Machine(
        cores_per_rank=cores,
        threads=min(threads, cores) if cores else threads,
        workers=workers,
        device=ctx.has_device,
        waiting=_waiting(environment) and (workers or 0) == 0,
        fetch_cpu_per_wall=fetch,
        compute_cpu_per_wall=rest,
    )


def _cpu_per_wall(environment: dict[str, Any], threads: int) -> tuple[Optional[float], Optional[float]]:
    """The fetches' and the rest of the step's CPU/wall (capture step clock). Where the machine ran more
    threads than it has CPUs (1-minute load average above the CPU count by half a CPU), descheduling lowers
    both alike: they are then read relative to each other, the busier one as the `threads` it could keep
    busy (a fetch at 0.5 beside compute at 0.5 on 2 threads is a fetch on 2 threads, not on one)."""
    times = environment.get("step_times")
    times = times if isinstance(times, dict) else {}
    fetch, rest = _number(times.get("fetch_cpu_per_wall")), _number(times.get("rest_cpu_per_wall"))
    recorded = environment.get("contention")
    contention: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    load, cpus = _number(contention.get("load_average_1m")), _number(environment.get("cpu_count"))
    if fetch is None or rest is None or not oversubscribed(load, cpus):
        return fetch, rest
    scale = max(threads / max(fetch, rest, 1e-3), 1.0)
    return min(fetch * scale, float(threads)), min(rest * scale, float(threads))


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _waiting(environment: dict[str, Any]) -> bool:
    """Whether the main-process loading waits (I/O, sleep) rather than computes. Best: the CPU time the
    process spent during its unprofiled fetches over their wall time (capture step clock), compared with
    the rest of the step, which suffers the same contention. Else: the whole process's CPU over wall in the
    window, trusted only on a machine that others left alone."""
    times = environment.get("step_times")
    if isinstance(times, dict) and _number(times.get("fetch_cpu_per_wall")) is not None:
        fetch = _number(times.get("fetch_cpu_per_wall")) or 0.0
        rest = _number(times.get("rest_cpu_per_wall"))
        return fetch < WAITING_FETCH_CPU and (rest is None or fetch < 0.5 * rest)
    recorded = environment.get("contention")
    contention: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    cpu_per_wall, others = _number(contention.get("process_cpu_per_wall")), _number(contention.get("other_share"))
    # A process that ran on a CPU under half the time waits for something, unless others took the CPUs.
    return cpu_per_wall is not None and cpu_per_wall < WAITING_CPU_PER_WALL and not (others is not None and others > OTHERS_BUSY_SHARE)




def _getitem_culprits(ctx: Context) -> str:
    """"__getitem__ (data.py:42): torch.manual_seed 43 %, ..." from the recorded stacks, or ""."""
    getitem = ctx.report.measurements.getitem
    if not getitem.frames or getitem.getitem_us_per_step <= 0:
        return ""
    total = getitem.getitem_us_per_step
    calls = [f"{name} {100 * us / total:.0f} %" for name, us in list(getitem.calls_us_per_step.items())[:3] if us >= 0.05 * total]
    return f"{getitem.frames[0]}: " + (", ".join(calls) if calls else "its own Python lines (no costly call)")


_QUEUE_TEXT = (
    "The loop waits in Queue.get() for batches that a producer (a thread or a process) puts on the queue: the "
    "producer does not keep up. Make each batch cheaper to build, or run more producers (threads help only where "
    "the work releases the GIL: file I/O, decoding in C; else processes), or move the production into a "
    "torch.utils.data.IterableDataset iterated by DataLoader(..., num_workers=N), whose workers are processes."
)


COLLATE_SHARE = 0.25  # of the main-process fetch (__getitem__ calls and collate_fn): the collate is named


def _costly_collate(ctx: Context) -> Optional[tuple[str, float, float]]:
    """(the collate_fn's readable name, its us per step, its share of the fetch) where it holds at least
    COLLATE_SHARE of what the main process spends fetching (recorded stacks), else None."""
    getitem = ctx.report.measurements.getitem
    if not getitem.collate_us_per_step:
        return None
    name, us = max(getitem.collate_us_per_step.items(), key=lambda kv: kv[1])
    fetch_us = getitem.getitem_us_per_step + sum(getitem.collate_us_per_step.values())
    share = us / fetch_us if fetch_us > 0 else 0.0
    return (name, us, share) if share >= COLLATE_SHARE else None


def _collate_text(collate: Optional[tuple[str, float, float]]) -> str:
    if collate is None:
        return ""
    name, us, share = collate
    where = f" The collate_fn, {name}, takes {ms(us)} per step ({100 * share:.0f} % of the fetch, recorded)"
    if name.startswith("default_collate"):
        # torch's own collate already only stacks: what costs is building the batch from single samples
        # (a TensorDataset of 128-sample batches: ~1 ms a batch, ~0.4 ms indexed once, this machine).
        return (f"{where}: it stacks the batch from samples fetched one at a time. Where the samples are tensors in "
                "memory (a TensorDataset), fetch each batch with one indexing op: DataLoader(dataset, "
                "sampler=torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), batch_size, "
                "drop_last=False), batch_size=None) hands __getitem__ the batch's indices (TensorDataset indexes "
                "its tensors with them as they are); else make each sample cheaper to stack.")
    return f"{where}: keep it to stacking tensors, and tokenize, pad or decode per sample in the dataset, or ahead of time."


def _iterator_culprits(ctx: Context) -> str:
    """"batches (train.py:8) 7.1 ms, ..." : what the loop's next() calls run, or ""."""
    frames = ctx.report.measurements.dataloader.iterator_frames_us_per_step
    return ", ".join(f"{name} {ms(us)}" for name, us in frames.items())


def _iterator_text(advice: Advice, culprits: str) -> str:
    where = "The loop fetches its batches with next() from an iterator that is no DataLoader" + (
        f" ({culprits} per step, recorded)" if culprits else "") + ", in the training process."
    move = ("Make it a torch.utils.data.IterableDataset (yield the samples or batches; split the work by "
            "torch.utils.data.get_worker_info() so workers do not repeat it) and iterate")
    if advice.workers is not None:
        return f"{where} {move} DataLoader(dataset, batch_size=None, num_workers={advice.workers}, persistent_workers=True): {advice.reason}."
    return f"{where} {move} a DataLoader with workers where cores allow ({advice.reason}), or make the batches cheaper to build."


def _text(advice: Advice, machine: Machine, settings: dict[str, Any], culprits: str, device: bool, getitem_matters: bool = True) -> str:
    current = machine.workers
    where = "The DataLoader loads batches in the training process (num_workers=0)." if current == 0 else (
        f"The DataLoader's {current} worker(s) do not keep up." if current else "The DataLoader does not keep up.")
    parts = [where]
    if advice.workers is not None:
        kwargs = [f"num_workers={advice.workers}"]
        if device and not settings.get("pin_memory"):
            kwargs.append("pin_memory=True")
        if not settings.get("persistent_workers") and settings.get("iterations", 2) > 1:
            kwargs.append("persistent_workers=True")
        line = f"Use DataLoader(..., {', '.join(kwargs)})"
        if advice.threads is not None:
            line += f" with torch.set_num_threads({advice.threads})"
        predicted = f"; predicted step {ms(advice.predicted_step_us)}" if advice.predicted_step_us else ""
        parts.append(f"{line}: {advice.reason}{predicted}.")
    elif current is None:
        parts.append(f"Raise num_workers if the cores allow it ({advice.reason}), with persistent_workers=True.")
    else:
        parts.append(f"More workers would not help: {advice.reason}.")
    if culprits:
        parts.append(f"Make __getitem__ cheaper; its costliest calls (recorded stacks): {culprits}.")
    elif (current == 0 or advice.workers is None) and getitem_matters:
        parts.append("Make __getitem__ cheaper (pre-decoded data, vectorised or cached transforms).")
    return " ".join(parts)


RESTARTS = Threshold(0.02, ">= 2 % of the mean step in the DataLoader workers' start, first batch and shutdown, in the steps the capture timed without the profiler (I; torch docs: persistent_workers keeps them alive across epochs)")


@rule(
    "data_loading.worker_restarts",
    "data_loading",
    RESTARTS,
    severity=by_share(),
    fixes=(Fix(kind="dataloader_kwarg", target="persistent_workers", value=True, summary="keep the workers alive across epochs"),),
)
def data_loading_worker_restarts(ctx: Context) -> Optional[Verdict]:
    """A multi-process DataLoader starts and stops its workers every epoch (persistent_workers=False)."""
    loader = ctx.report.measurements.dataloader
    if loader.unprofiled_steps <= 0 or loader.unprofiled_step_mean_us <= 0 or loader.worker_restarts_per_step <= 0:
        return None
    share = loader.restart_us_per_step / loader.unprofiled_step_mean_us
    if share < RESTARTS.value:
        return None
    every = 1.0 / loader.worker_restarts_per_step
    per_restart = loader.restart_us_per_step * every
    # Low: the workers' start and shutdown (persistent workers skip both); the first fetch also waits for
    # the first batch, which persistent workers load too. High: the whole turnover, or all the turnover steps
    # cost beyond a typical step (the iterator's set-up and teardown around the timed calls).
    low = max(loader.restart_us_per_step - loader.restart_first_fetch_us_per_step, 0.0) / loader.unprofiled_step_mean_us
    high = max(min(loader.restart_step_excess_us_per_step / loader.unprofiled_step_mean_us, 1.0), share)
    return Verdict(
        title=f"The DataLoader restarts its workers every {every:.3g} steps ({ms(per_restart)} each): "
        f"{pct(share)} of the mean step",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "restart_us_per_step": loader.restart_us_per_step,
            "restart_first_fetch_us_per_step": loader.restart_first_fetch_us_per_step,
            "restart_step_excess_us_per_step": loader.restart_step_excess_us_per_step,
            "steps_per_restart": every,
            "restart_us": per_restart,
            "unprofiled_step_mean_us": loader.unprofiled_step_mean_us,
            "unprofiled_steps": loader.unprofiled_steps,
        },
        recommendation=(
            "Without persistent_workers=True each epoch starts the DataLoader's worker processes, waits for their "
            "first batches and shuts them down at its end, in one step of every epoch (a short epoch makes it "
            "frequent). Pass persistent_workers=True to keep them alive across epochs."
        ),
    )


OVERSUBSCRIBED = Threshold(
    0.05,
    "CPU compute: DataLoader workers (using >= 0.25 CPU) plus compute's intra-op threads over the rank's cores, "
    "and compute short of its threads' cores by >= 5 % of the step, slower in the median unprofiled step than in "
    "the fastest tenth (I; torch's DataLoader warns above its suggested worker count)",
)
BUSY_WORKERS = 0.25  # CPUs the workers used per wall second: below it they mostly wait (I/O, sleep)


@rule(
    "data_loading.oversubscribed_workers",
    "data_loading",
    OVERSUBSCRIBED,
    severity=by_share(),
    fixes=(
        Fix(kind="dataloader_kwarg", target="num_workers", summary="only as many workers as the cores compute's threads leave free"),
        Fix(kind="torch_flag", target="torch.set_num_threads", summary="fewer intra-op threads, so compute and the workers fit the cores"),
    ),
)
def data_loading_oversubscribed_workers(ctx: Context) -> Optional[Verdict]:
    """DataLoader workers take the cores compute's intra-op threads need (a CPU run): the forward, backward
    and optimizer run slower in most steps than in the few where the workers left them the cores."""
    clock = ctx.report.measurements.phase_clock
    if ctx.has_device or clock.unprofiled_steps <= 0 or clock.excess_us_per_step <= 0 or clock.step_median_us <= 0:
        return None
    settings = ctx.main_loader()
    machine = _machine(ctx, settings, single=False)
    cores, workers, threads = machine.cores_per_rank, machine.workers or 0, machine.threads
    if cores is None or workers == 0 or workers + threads <= cores:
        return None
    # The workers must compute (a worker waiting on I/O takes no core) and compute must have gone short of
    # cores: both measured, or no verdict (the phases' spread alone may be work that varies per step).
    if clock.children_cpu_per_wall < BUSY_WORKERS or clock.compute_cpu_per_wall <= 0:
        return None
    compute_us = sum(clock.median_us.values())
    fastest_us = sum(clock.fastest_us.values())
    high_us = clock.excess_us_per_step
    # Low: what the main process's CPU time says compute lost (it got `compute_cpu_per_wall` of its threads'
    # cores); high: the phases' median over their fastest tenth (which also holds any step-to-step variation).
    low_us = min(compute_us * max(1.0 - clock.compute_cpu_per_wall / max(threads, 1), 0.0), high_us)
    low, high = low_us / clock.step_median_us, high_us / clock.step_median_us
    if low < OVERSUBSCRIBED.value:
        return None
    spare = max(cores - threads, 0)
    fewer_threads = cores - workers if workers < cores else None
    # The workers' CPU per step: what the training process would do itself without them. Where it exceeds
    # what the contention costs, fewer workers lose more than they save: split the cores instead.
    loading_us = clock.children_cpu_per_wall * clock.step_median_us
    values: dict[str, FixValue]
    if loading_us >= high_us and cores >= 2:
        keep = min(workers, cores - 1)
        values = {"torch.set_num_threads": cores - keep, **({"num_workers": keep} if keep < workers else {})}
        try_it = f"set_num_threads={cores - keep}" + (f",num_workers={keep}" if keep < workers else "")
        advice = (
            f"Split the cores instead of dropping the workers: torch.set_num_threads({cores - keep})"
            + (f" with num_workers={keep}" if keep < workers else f" beside the {workers} worker(s)")
            + f". The workers use {ms(loading_us)} of CPU per step, more than the {ms(high_us)} the contention costs: with "
            f"num_workers={spare} the training process would take over loading they cannot keep up with. Fewer compute threads "
            f"make the model's operators slower where they scale, so the split may save nothing: measure it with "
            f"torchscope tune --try {try_it}."
        )
        # Measured on 2 cores: 2 workers beside 2 threads 57.8 ms a step, 1 worker and 1 thread 39.7 ms; but 1
        # worker beside 2 threads 40.6 ms, with 1 thread 48.4 ms. The low end is no saving.
        low = 0.0
    else:
        values = {"num_workers": spare, **({"torch.set_num_threads": fewer_threads} if fewer_threads else {})}
        alternative = f", or keep them and give compute torch.set_num_threads({fewer_threads})" if fewer_threads else ""
        advice = (
            f"Use at most {spare} worker(s) (num_workers={spare}){alternative}; fewer workers load each batch more "
            "slowly, so measure the choice: torchscope tune --try num_workers=N."
        )
    return Verdict(
        title=f"{workers} DataLoader worker(s) and compute's {threads} intra-op thread(s) share {cores} core(s): "
        f"forward/backward/optimizer take {ms(compute_us)} per step against {ms(fastest_us)} in their fastest steps",
        share=(low + high) / 2,
        share_range=(low, high),
        evidence={
            "num_workers": workers,
            "intra_op_threads": threads,
            "cores_per_rank": cores,
            "compute_median_us_by_phase": clock.median_us,
            "compute_fastest_us_by_phase": clock.fastest_us,
            "contention_us_per_step": high_us,
            "compute_cpu_per_wall": clock.compute_cpu_per_wall,
            "workers_cpu_per_wall": clock.children_cpu_per_wall,
            "unprofiled_steps": clock.unprofiled_steps,
            "workers_cpu_us_per_step": loading_us,
        },
        recommendation=(
            f"Each DataLoader worker is a process with its own thread, and compute runs {threads} intra-op thread(s): "
            f"{workers + threads} busy threads on {cores} core(s), so the model's operators wait for cores in most steps. "
            + advice
        ),
        fix_values=values,
        fix_targets=tuple(values),
    )


PAGEABLE = Threshold(0.02, "any is reported (NSYS `cuda_memcpy_async` flags every pageable copy); warning from 2 % of the step")


@rule(
    "h2d_copy.pageable",
    "h2d_copy",
    PAGEABLE,
    severity=by_share(PAGEABLE.value, critical_from=None),
    fixes=(PIN_MEMORY, NON_BLOCKING),
)
def h2d_copy_pageable(ctx: Context) -> Optional[Verdict]:
    """Host-to-device copies from pageable memory: staged through a driver buffer, never asynchronous."""
    copies = ctx.report.measurements.copies
    count = copies.pageable_htod_per_step
    if count <= 0:
        return None
    us = copies.pageable_htod_us_per_step
    share = ctx.share(us)
    return Verdict(
        title=f"Host-to-device copies from pageable memory: {count:.0f} per step, {ms(us)}",
        share=share,
        evidence={
            "pageable_copies_per_step": count,
            "pageable_copy_us_per_step": us,
            "pageable_bytes_per_step": copies.pageable_htod_bytes_per_step,
            "median_bandwidth_gbps": copies.pageable_bandwidth_gbps,
        },
        recommendation=(
            "Copy from pinned memory and let the copy overlap: DataLoader(pin_memory=True) and "
            "batch.to(device, non_blocking=True); pinned copies run at full PCIe bandwidth and do not block the host."
        ),
    )


BLOCKING = Threshold(0.02, "warning from 2 % of the step (NSYS `cuda_memcpy_sync`)")
COPY_OPS = ("aten::to", "aten::copy_", "aten::_to_copy", "aten::cuda", "aten::cpu")


@rule(
    "h2d_copy.blocking",
    "h2d_copy",
    BLOCKING,
    severity=by_share(BLOCKING.value, critical_from=None),
    fixes=(
        NON_BLOCKING,
        PIN_MEMORY,
        Fix(
            kind="code_change",
            target="tensor factories",
            value="torch.zeros(..., device='cuda')",
            summary="create tensors on the device instead of copying them there",
        ),
    ),
)
def h2d_copy_blocking(ctx: Context) -> Optional[Verdict]:
    """Copies that make the host wait for the device: syncs issued under aten::to / copy_ (a copy with
    non_blocking=False, or to pageable host memory)."""
    blocking = {op: us for op, us in ctx.report.measurements.sync.by_op.items() if op in COPY_OPS}
    if not blocking or not ctx.has_device:
        return None
    us = sum(blocking.values())
    all_us = sum(ctx.report.measurements.sync.by_op.values())
    share, share_range = ctx.cost("sync", ctx.share(us), scale=us / all_us if all_us else 0.0)
    return Verdict(
        title=f"Blocking copies: the host waits {ms(us)} per step for copies to finish",
        share=share,
        share_range=share_range,
        evidence={"blocking_copy_sync_us_per_step": us, "by_op_us_per_step": blocking},
        recommendation="Use tensor.to(device, non_blocking=True) from pinned memory (DataLoader(pin_memory=True)), "
        "and create tensors directly on the device (torch.zeros(..., device='cuda')) instead of copying them.",
    )
