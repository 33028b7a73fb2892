"""Step windows: where each training step starts and ends, on the host and including its device work.

Steps are the `ProfilerStep#N` ranges that `torch.profiler`'s `prof.step()` records. On traces with device
activity a step is stretched to cover the GPU work it launched, following the TensorBoard plugin's rule
(so figures are comparable): a runtime call inside the step's host range owns the device ops that share
its correlation id; start = max(previous step end, host start), end = max(host end, last owned device
end). Trailing steps whose device work was cut off by the end of the capture are dropped.
When a trace has no step markers the whole traced span is one window, and the result says so.
"""

from __future__ import annotations

import re

import msgspec
import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.nesting import host_tree, launcher_of_device_events, nearest_ancestor_of
from torchscope.arrays import read_only
from torchscope.rundir.manifest import StepSource
from torchscope.rundir.labels import STEP_PREFIX
from torchscope.trace.kinds import DEVICE_KINDS, Kind
from torchscope.trace.tables import EventTable


class StepWindows(msgspec.Struct, frozen=True):
    """Step windows of one trace file, sorted by start; all arrays have one entry per step."""

    number: np.ndarray
    start_us: np.ndarray
    end_us: np.ndarray
    source: StepSource
    evaluation_steps: int = 0  # steps left out as evaluation (analysis/step_kinds.py), and their time
    evaluation_us: float = 0.0

    def __len__(self) -> int:
        return int(self.number.size)

    @property
    def duration_us(self) -> np.ndarray:
        return self.end_us - self.start_us

    def index_of(self, ts_us: np.ndarray) -> np.ndarray:
        """Index of the step window holding each timestamp (start inclusive, end exclusive), else -1."""
        if self.number.size == 0:  # every step of the span was cut off (see `_steps_with_operators`)
            return np.full(np.shape(ts_us), -1, dtype=np.int64)
        step = np.searchsorted(self.start_us, ts_us, side="right") - 1
        inside = (step >= 0) & (ts_us < self.end_us[np.maximum(step, 0)])
        return np.where(inside, step, -1)

    def index_holding_end(self, end_us: np.ndarray) -> np.ndarray:
        """Index of the step window holding each interval's end (start exclusive, end inclusive: an
        interval that ends where a step ends is in it), else -1."""
        if self.number.size == 0:
            return np.full(np.shape(end_us), -1, dtype=np.int64)
        step = np.searchsorted(self.end_us, end_us, side="left")  # the first window ending at or after it
        at = np.minimum(step, self.number.size - 1)
        return np.where((step < self.number.size) & (self.start_us[at] < end_us), step, -1)

    def number_at(self, ts_us: np.ndarray) -> np.ndarray:
        """The step number (ProfilerStep#N) of the window holding each timestamp, else -1."""
        index = self.index_of(ts_us)
        if self.number.size == 0:  # no step: every index is -1
            return index
        return np.where(index >= 0, self.number[np.maximum(index, 0)], -1)


def event_steps(events: EventTable, steps: StepWindows) -> np.ndarray:
    """`steps.index_of` every event's start, computed once per table and step windows (several analyses
    ask; read-only, as it is shared)."""
    # The memo holds `steps` too: kept alive, its id cannot be reused by other windows while the table lives.
    # int32: kept as long as the table, at half the memory of int64 (step counts are small).
    _, index = events.memo(f"step_index:{id(steps)}", lambda: (steps, read_only(steps.index_of(events.ts_us).astype(np.int32))))
    return index


def step_marker_mask(events: EventTable) -> np.ndarray:
    return events.memo("step_markers", lambda: _step_marker_mask(events))


def _step_marker_mask(events: EventTable) -> np.ndarray:
    return step_name_mask(events) & events.kind_mask((Kind.CPU_OP, Kind.USER_ANNOTATION))


def step_name_mask(events: EventTable) -> np.ndarray:
    """Events named like a ProfilerStep marker, of any kind (computed once per table)."""
    return events.memo("step_names", lambda: events.name_mask(lambda s: s.startswith(STEP_PREFIX)))


def main_thread_mask(events: EventTable) -> np.ndarray:
    """Events on the thread that records the ProfilerStep markers (the training loop's thread).
    Computed once per table (several analyses ask); callers must not modify it."""
    return events.memo("main_thread_mask", lambda: read_only(_main_thread_mask(events)))


def _main_thread_mask(events: EventTable) -> np.ndarray:
    is_step = step_name_mask(events) & (events.kind != Kind.GPU_USER_ANNOTATION)
    if not is_step.any():
        host = events.kind_mask((Kind.CPU_OP, Kind.USER_ANNOTATION))
        if not host.any():
            return np.zeros(len(events), dtype=bool)
        # The thread with the most host events outside the autograd engine's node ranges: on a GPU the
        # engine's device thread can record more events than the loop itself (7185 against 7161 in a
        # sample), all of them backward.
        nodes = host & events.name_mask(_is_engine_node)
        loop_work = host & ~(nearest_ancestor_of(host_tree(events), nodes) >= 0)
        host = loop_work if loop_work.any() else host
        keys = (events.pid[host].astype(np.int64) << 32) | events.tid[host]
        values, counts = np.unique(keys, return_counts=True)
        main = values[np.argmax(counts)]
    else:
        first = np.flatnonzero(is_step)[0]
        main = (np.int64(events.pid[first]) << 32) | np.int64(events.tid[first])
    return events.thread_keys() == main


def _is_engine_node(name: str) -> bool:
    return name.startswith("autograd::engine::evaluate_function:")


def find_steps(events: EventTable) -> StepWindows:
    markers = np.flatnonzero(step_marker_mask(events) & (events.dur_us > 0))
    if markers.size == 0:
        return _whole_trace(events)
    numbers = np.array([_step_number(s) for s in events.text(events.name[markers])], dtype=np.int64)
    starts = events.ts_us[markers]
    ends = starts + events.dur_us[markers]
    # The same step can be recorded twice (e.g. as cpu_op and user_annotation): keep one per number+start.
    _, unique = np.unique(np.stack([numbers.astype(np.float64), starts]), axis=1, return_index=True)
    order = unique[np.argsort(starts[unique], kind="stable")]
    numbers, starts, ends = numbers[order], starts[order], ends[order]
    return _stretch_to_device(events, numbers, starts, ends)


def _step_number(name: str) -> int:
    digits = name[len(STEP_PREFIX) :].strip()
    # ASCII digits only (int() rejects e.g. "²"), and small enough for an int64 column.
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 18 else -1


def _whole_trace(events: EventTable) -> StepWindows:
    timed = events.kind_mask((*DEVICE_KINDS, Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.RUNTIME, Kind.PYTHON_FUNCTION))
    if not timed.any():
        timed = events.kind != Kind.METADATA
    start = float(events.ts_us[timed].min(initial=np.inf))
    end = float((events.ts_us[timed] + events.dur_us[timed]).max(initial=-np.inf))
    if not np.isfinite(start) or end < start:
        start = end = 0.0
    return StepWindows(np.array([-1]), np.array([start]), np.array([end]), "whole_trace")


def _stretch_to_device(
    events: EventTable, numbers: np.ndarray, host_start: np.ndarray, host_end: np.ndarray
) -> StepWindows:
    device = events.kind_rows(DEVICE_KINDS)
    owner = _device_owner_step(events, device, host_start, host_end)
    if device.size == 0 or not (owner >= 0).any():
        keep = _steps_with_operators(events, host_start, host_end)
        return StepWindows(numbers[keep], host_start[keep], host_end[keep], "profiler_step")
    dev_start = events.ts_us[device]
    dev_end = dev_start + events.dur_us[device]
    n = numbers.size
    matched = np.bincount(owner[owner >= 0], minlength=n)
    dev_max = np.full(n, -np.inf)
    np.maximum.at(dev_max, owner[owner >= 0], dev_end[owner >= 0])
    dev_min0 = dev_start[owner == 0].min(initial=np.inf)
    prev_end = host_start[0]
    if matched[0] > 0:
        earlier = (owner < 0) & (dev_end < dev_min0)
        prev_end = max(prev_end, float(dev_end[earlier].max(initial=-np.inf)))
    start = np.empty(n)
    end = np.empty(n)
    for i in range(n):  # one iteration per step, not per event
        start[i] = max(prev_end, host_start[i])
        end[i] = max(host_end[i], dev_max[i]) if matched[i] else max(host_end[i], start[i])
        prev_end = end[i]
    keep = _steps_with_complete_device_work(matched)
    return StepWindows(numbers[keep], start[keep], end[keep], "profiler_step")


def _device_owner_step(
    events: EventTable, device: np.ndarray, host_start: np.ndarray, host_end: np.ndarray
) -> np.ndarray:
    """Index of the step owning each device event (-1 if none): the step whose host range holds the
    runtime call that launched it."""
    launcher = launcher_of_device_events(events, device)
    rt = np.maximum(launcher, 0)
    rt_start = events.ts_us[rt]
    step = np.searchsorted(host_start, rt_start, side="right") - 1
    inside = (launcher >= 0) & (step >= 0) & (rt_start + events.dur_us[rt] <= host_end[np.maximum(step, 0)])
    return np.where(inside, step, -1)


def _steps_with_operators(events: EventTable, host_start: np.ndarray, host_end: np.ndarray) -> np.ndarray:
    """Drop trailing steps the profiler's stop cut off at once: the step `prof.step()` opened just before the
    loop ended (a `break`, or the last iteration), which holds no operator, range, runtime call or memory
    event but the DataLoader's last fetch (the one that raises StopIteration), and either no Python frame
    (stacks off) or the profiler's own `stop` (a 77 us `ProfilerStep#8`, the only step of a trace written
    when a schedule's next cycle was cut short). It would read as a step of the run."""
    work = events.kind_rows((Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.MEMORY, Kind.RUNTIME, Kind.DRIVER))
    fetches = work[events.name_mask(is_data_loading_name, work)]
    fetching = intervals.union(events.ts_us[fetches], events.ts_us[fetches] + events.dur_us[fetches])
    work = work[~step_marker_mask(events)[work] & ~intervals.contains(fetching, events.ts_us[work])]
    frames = events.kind_rows(Kind.PYTHON_FUNCTION)
    stops = frames[events.name_mask(_is_profiler_stop, frames)]
    held = {name: _held(events.ts_us[rows], host_start, host_end) for name, rows in (("work", work), ("frames", frames), ("stops", stops))}
    cut = (held["work"] == 0) & ((held["frames"] == 0) | (held["stops"] > 0))
    keep = np.ones(host_start.size, dtype=bool)
    kept = np.flatnonzero(~cut)
    keep[(kept[-1] + 1 if kept.size else 0) :] = False  # the trailing run of cut-off steps
    return keep


def _held(ts: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per window [start, end): how many of the timestamps `ts` fall in it (one sort, two searches)."""
    ts = np.sort(ts)
    return np.searchsorted(ts, end, side="left") - np.searchsorted(ts, start, side="left")


def is_data_loading_name(name: str) -> bool:
    """PyTorch's range around a DataLoader's (or DataPipe's) fetch of one batch."""
    return (name.startswith("enumerate(DataLoader)#") and name.endswith(".__next__")) or name.startswith(
        "enumerate(DataPipe)#"
    )


_PROFILER_STOP = re.compile(r"(^|/)torch/profiler/profiler\.py\(\d+\): (stop|__exit__)$")


def _is_profiler_stop(name: str) -> bool:
    return _PROFILER_STOP.search(name) is not None


def _steps_with_complete_device_work(matched: np.ndarray) -> np.ndarray:
    """Drop trailing steps without device work, and a last step with under 80 % of the previous one's
    device ops (its work was cut off when the profiler stopped)."""
    keep = np.ones(matched.size, dtype=bool)
    with_work = np.flatnonzero(matched > 0)
    if matched.size <= 1 or with_work.size == 0:
        return keep
    last = int(with_work[-1])
    keep[last + 1 :] = False
    if last >= 1 and matched[last - 1] * 0.8 > matched[last]:
        keep[last] = False
    return keep
