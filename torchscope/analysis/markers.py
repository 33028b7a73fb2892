"""Names that PyTorch (and torchscope's capture) give to ranges, turned into boolean event masks.

One place for every name pattern the analyses rely on, so each is documented once:
* data loading: `enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__` (num_workers=0) or
  `..._MultiProcessingDataLoaderIter.__next__`, and `enumerate(DataPipe)#...` (torch.utils.data).
* optimizer: `Optimizer.step#SGD.step`, `Optimizer.zero_grad#SGD.zero_grad` (torch.optim; with stacks also
  torch.optim's frames that open them, for ranges opened before the recorded window), and the
  `torchscope:optimizer` label; the `torchscope:closure` label marks the closure an `optimizer.step(closure)`
  runs (its time is not the optimizer's).
* backward: `autograd::engine::evaluate_function: XBackward0` (the autograd engine; bare `XBackward` node
  names in PyTorch <= 1.9), the `torchscope:backward` label.
* forward: the `torchscope:forward` label, `DistributedDataParallel.forward`, `DataParallel.forward`.
* communication: collective ops `nccl:*`, `gloo:*`, `c10d::*`, `record_param_comms`, NCCL/RCCL kernels
  (`ncclKernel_*`, `ncclDevKernel_*`), and with stacks the `Work.wait()` calls torch.distributed makes.
User `record_function` labels named like a phase ("forward", "backward", "optimizer", "data") count too, and
so do Lightning's PyTorchProfiler action ranges (`[pl][profile]...training_step`, `...backward`,
`...optimizer_step`, `...optimizer_zero_grad`, `...train_dataloader_next`).
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import is_interpreter_or_torch_code
from torchscope.analysis.nesting import calling_frame, host_tree
from torchscope.analysis.steps import is_data_loading_name, main_thread_mask
from torchscope.arrays import group_ids, read_only
from torchscope.rundir.labels import CLOSURE, LABEL_PREFIX, PHASE_LABELS, STEP_PREFIX
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

COMM_OP_PREFIXES = ("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")
COMM_KERNEL_PREFIXES = ("ncclKernel", "ncclDevKernel", "rcclKernel")


def is_optimizer_name(name: str) -> bool:
    return name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) or name == PHASE_LABELS["optimizer"]


# torch.optim's own frames (with stacks): the wrapper that opens the `Optimizer.step#` range around every
# optimizer's step, and zero_grad. They stand in for the ranges when those opened before the recorded window
# (the Python tracer records the frames open at its start; a range that opened earlier is not in the
# trace): Lightning's PyTorchProfiler steps the profiler at the end of training_step, inside the closure
# that optimizer.step runs, so the first recorded step holds the rest of an optimizer step whose range is
# missing.
_OPTIMIZER_FRAME = re.compile(r"(^|/)torch/optim/optimizer\.py\(\d+\): (wrapper|zero_grad)$")


# nn.Module.zero_grad: the same work as the optimizer's (a Hugging Face Trainer calls model.zero_grad()
# after each optimizer step: 0.34 ms a step, named as work outside the phases).
_MODULE_ZERO_GRAD_FRAME = re.compile(r"(^|/)torch/nn/modules/module\.py\(\d+\): zero_grad$")


def is_optimizer_frame(name: str) -> bool:
    return _OPTIMIZER_FRAME.search(name) is not None or _MODULE_ZERO_GRAD_FRAME.search(name) is not None


# torch.optim's modules and the optimizer class whose `step` each defines.
_TORCH_OPTIM_MODULES = {
    "adadelta": "Adadelta", "_adafactor": "Adafactor", "adagrad": "Adagrad", "adam": "Adam", "adamax": "Adamax",
    "adamw": "AdamW", "asgd": "ASGD", "lbfgs": "LBFGS", "nadam": "NAdam", "radam": "RAdam", "rmsprop": "RMSprop",
    "rprop": "Rprop", "sgd": "SGD", "sparse_adam": "SparseAdam",
}  # fmt: skip
_TORCH_OPTIM_STEP = re.compile(r"(?:^|/)torch/optim/(\w+)\.py\(\d+\): step$")


def torch_optimizer_of_frame(name: str) -> str | None:
    """The torch.optim class of a `torch/optim/<module>.py(N): step` frame, e.g. "LBFGS"; else None."""
    match = _TORCH_OPTIM_STEP.search(name)
    return _TORCH_OPTIM_MODULES.get(match[1]) if match else None


def is_torch_optim_step_frame(name: str) -> bool:
    return torch_optimizer_of_frame(name) is not None


def is_optimizer_step_frame(name: str) -> bool:
    """The frame of the wrapper around every torch.optim optimizer's step (it opens `Optimizer.step#`)."""
    return _OPTIMIZER_FRAME.search(name) is not None and name.endswith(": wrapper")


_BACKWARD_NODE = re.compile(r"Backward\d*$")


def is_backward_name(name: str) -> bool:
    """Autograd engine work: `evaluate_function:` wrappers (PyTorch >= 1.10) or bare autograd node names
    such as `CudnnConvolutionBackward` / `torch::autograd::AccumulateGrad` (older traces)."""
    return (
        name.startswith("autograd::engine::evaluate_function:")
        or name == PHASE_LABELS["backward"]
        or name == "torch::autograd::AccumulateGrad"
        or (not name.startswith("aten::") and _BACKWARD_NODE.search(name) is not None)
    )


def is_forward_name(name: str) -> bool:
    return name == PHASE_LABELS["forward"] or name in ("DistributedDataParallel.forward", "DataParallel.forward")


def is_comm_op_name(name: str) -> bool:
    return name.startswith(COMM_OP_PREFIXES) or name == "record_param_comms"


def is_comm_kernel_name(name: str) -> bool:
    return name.startswith(COMM_KERNEL_PREFIXES)


# Lightning's PyTorchProfiler records each profiled action as a "[pl][profile]<action>" range
# (lightning.pytorch.profilers.pytorch): the strategy's training_step (forward and loss; with automatic
# optimization it runs in optimizer.step's closure) and backward, the LightningModule's optimizer_step (which
# holds that closure: the phase partition takes the forward and backward nested in it out of the optimizer's
# time) and optimizer_zero_grad, and the epoch loop's batch fetch. Validation, test and predict steps are
# recorded steps too (the profiler steps after them as well): their step is the model's forward.
LIGHTNING_PREFIX = "[pl][profile]"
_LIGHTNING_ACTIONS = (
    (".training_step", "forward"),
    # Lightning steps the profiler after these too, so their batches are recorded steps: the model's forward.
    (".validation_step", "forward"),
    (".test_step", "forward"),
    (".predict_step", "forward"),
    (".backward", "backward"),
    (".optimizer_step", "optimizer"),
    (".optimizer_zero_grad", "optimizer"),
    (".train_dataloader_next", "data_loading"),
)


def user_phase_of(name: str) -> str | None:
    """Phase named by a user's own record_function label, e.g. "forward" or "## backward ##", or by a
    Lightning action's range, e.g. "[pl][profile][Strategy]SingleDeviceStrategy.training_step"."""
    if name.startswith(LIGHTNING_PREFIX):
        return next((phase for suffix, phase in _LIGHTNING_ACTIONS if name.endswith(suffix)), None)
    word = name.strip("#:_- ").lower()
    for phase in ("forward", "backward", "optimizer"):
        if word == phase or word in (f"{phase}_pass", f"{phase} pass", f"model.{phase}"):
            return phase
    if word in ("data", "data_loading", "dataloader", "data loading", "load_data"):
        return "data_loading"
    return None


def name_mask(events: EventTable, predicate: Callable[[str], bool], kinds: tuple[Kind, ...]) -> np.ndarray:
    """Events of `kinds` whose name satisfies `predicate` (evaluated once per distinct string)."""
    return events.name_mask(predicate) & events.kind_mask(kinds)


def frame_mask(events: EventTable, predicate: Callable[[str], bool]) -> np.ndarray:
    """Python frames whose name satisfies `predicate`: looked up among the frames' own names only (a trace
    recorded without stacks has none, and pays nothing)."""
    mask = np.zeros(len(events), dtype=bool)
    frames = events.kind_rows(Kind.PYTHON_FUNCTION)
    if frames.size:
        mask[frames] = events.name_mask(predicate, frames)
    return mask


def named_rows(events: EventTable, predicate: Callable[[str], bool], kinds: tuple[Kind, ...]) -> np.ndarray:
    """The rows (ascending) of `name_mask`: a whole-table mask, cheaper than a mask over a subset of rows,
    which finds that subset's distinct names each time."""
    return np.flatnonzero(name_mask(events, predicate, kinds))


def named_ops_in_steps(events: EventTable, step_of: np.ndarray, predicate: Callable[[str], bool]) -> np.ndarray:
    """The rows (ascending) of the CPU ops named by `predicate` that start inside a step (`step_of`: each
    event's step, `steps.event_steps`)."""
    rows = named_rows(events, predicate, (Kind.CPU_OP,))
    return rows[step_of[rows] >= 0]


HOST_RANGES = (Kind.CPU_OP, Kind.USER_ANNOTATION)


def phase_masks(events: EventTable) -> dict[str, np.ndarray]:
    """Event masks of the ranges that mark each training phase on the host (computed once per table)."""
    return events.memo("phase_masks", lambda: _phase_masks(events))


def _phase_masks(events: EventTable) -> dict[str, np.ndarray]:
    named = named_phase_masks(events)
    return named | {
        "data_loading": named["data_loading"] | batch_fetch_mask(events),
        "communication": named["communication"] | collective_wait_mask(events),
    }


# How torch's Python tracer names a call of a method bound in C++ named `wait` (c10d's `Work.wait`); the
# owner's name varies with the pybind11 version ("PyCapsule", "pybind11_builtins.pybind11_detail_...").
_BUILTIN_WAIT = re.compile(r"^<built-in method wait of ")
_DISTRIBUTED_FRAME = re.compile(r"(^|/)torch/distributed/")


def _is_builtin_wait(name: str) -> bool:
    return _BUILTIN_WAIT.match(name) is not None


def _is_distributed_frame(name: str) -> bool:
    return _DISTRIBUTED_FRAME.search(name) is not None


def collective_wait_mask(events: EventTable) -> np.ndarray:
    """The training loop's waits for a collective's work called from torch.distributed (with stacks): gloo
    runs a collective on its own threads while the caller waits in `Work.wait()`, outside the `c10d::` op's range. Lightning's
    per-step SIGTERM broadcast under DDP waited there 0.4-1.6 ms a step, read as work outside the phases."""
    mask = np.zeros(len(events), dtype=bool)
    # The training loop's thread only: a background thread blocked in a collective (a heartbeat broadcast)
    # would otherwise take the loop's overlapping forward and backward, communication coming first.
    rows = np.flatnonzero(frame_mask(events, _is_builtin_wait) & main_thread_mask(events))
    if rows.size == 0:
        return mask
    caller = calling_frame(host_tree(events), events.kind, rows)
    rows, caller = rows[caller >= 0], caller[caller >= 0]
    mask[rows[events.name_mask(_is_distributed_frame, caller)]] = True
    return mask


def named_phase_masks(events: EventTable) -> dict[str, np.ndarray]:
    """The phases' ranges by name: PyTorch's, torchscope's labels and the user's own (once per table;
    shared: read-only by convention)."""
    return events.memo("named_phase_masks", lambda: _named_phases(events))


def _named_phases(events: EventTable) -> dict[str, np.ndarray]:
    # The user's labels are a few rows: their phase is looked up once per distinct name among them.
    labels = events.kind_rows(Kind.USER_ANNOTATION)
    label_names, slot = group_ids(events.name[labels])
    label_phase = np.array([user_phase_of(events.strings[i]) or "" for i in label_names.tolist()], dtype=object)[slot]

    def with_user(mask: np.ndarray, phase: str) -> np.ndarray:
        mask[labels[label_phase == phase]] = True
        return mask

    return {
        "data_loading": with_user(name_mask(events, is_data_loading_name, HOST_RANGES), "data_loading"),
        "optimizer": with_user(
            name_mask(events, is_optimizer_name, HOST_RANGES) | frame_mask(events, is_optimizer_frame), "optimizer"
        ),
        "backward": with_user(name_mask(events, is_backward_name, HOST_RANGES), "backward"),
        "forward": with_user(name_mask(events, is_forward_name, HOST_RANGES), "forward"),
        "communication": name_mask(events, is_comm_op_name, HOST_RANGES),
    }


NEXT_CALL = "<built-in function next>"  # how torch's Python tracer names a call of the builtin next()
# `Queue.get` of the standard library (threads, multiprocessing), as the tracer names it (the path relative
# to sys.path or absolute): a loop whose producer thread or process prepares the batches waits there.
_QUEUE_GET = re.compile(r"(^|/)(queue|multiprocessing/queues)\.py\(\d+\): get$")


def batch_fetch_mask(events: EventTable) -> np.ndarray:
    """The training loop's own ``next(...)`` and ``Queue.get()`` calls outside the other phases: the loop
    fetching its batch, also from an iterator that is no DataLoader (a generator, a tokenizing iterable)
    or from a queue a producer fills, which PyTorch marks with no range. The loop's thread only (a prefetching thread's ``next`` overlaps the compute it hides
    behind); Python calls are in the trace only with stacks recorded. Once per table, read-only."""
    return events.memo("batch_fetches", lambda: read_only(_batch_fetches(events, named_phase_masks(events))))


def _batch_fetches(events: EventTable, phases: dict[str, np.ndarray]) -> np.ndarray:
    rows = np.flatnonzero(events.name_mask(is_batch_call) & events.kind_mask(Kind.PYTHON_FUNCTION))
    fetches = np.zeros(len(events), dtype=bool)
    if rows.size == 0:
        return fetches
    # Called by the loop's own code (the user's, or a trainer's from an installed package), not by the
    # standard library (contextlib's __enter__ resumes a generator with next()), torch or torchscope.
    rows = rows[main_thread_mask(events)[rows]]
    caller = calling_frame(host_tree(events), events.kind, rows)
    rows, caller = rows[caller >= 0], caller[caller >= 0]
    rows = rows[~events.name_mask(is_interpreter_or_torch_code, caller)]
    others = np.flatnonzero(phases["forward"] | phases["backward"] | phases["optimizer"] | phases["communication"])
    start = events.ts_us[others]
    taken = intervals.union(start, start + events.dur_us[others])
    fetches[rows[~intervals.contains(taken, events.ts_us[rows])]] = True
    return fetches


def is_batch_call(name: str) -> bool:
    """A call that fetches a batch when the training loop makes it: ``next()``, or a queue's ``get``."""
    return name == NEXT_CALL or is_queue_get(name)


def is_queue_get(name: str) -> bool:
    return _QUEUE_GET.search(name) is not None


def closure_mask(events: EventTable) -> np.ndarray:
    """The closures run by ``optimizer.step(closure)``, as the capture labels them (once per table; shared,
    so read-only)."""
    return events.memo("closures", lambda: read_only(name_mask(events, lambda s: s == CLOSURE, HOST_RANGES)))


def own_marker_mask(events: EventTable) -> np.ndarray:
    """Events named like a ProfilerStep marker or a torchscope phase label, of any kind (once per table)."""
    return events.memo("own_markers", lambda: events.name_mask(lambda s: s.startswith((STEP_PREFIX, LABEL_PREFIX))))


def comm_kernel_mask(events: EventTable) -> np.ndarray:
    """NCCL/RCCL kernels, by name (once per table; shared, so read-only)."""
    return events.memo("comm_kernels", lambda: read_only(name_mask(events, is_comm_kernel_name, (Kind.KERNEL,))))
