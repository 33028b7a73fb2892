"""What a Dataset's ``__getitem__`` spends its time on, from the recorded Python stacks.

When the DataLoader loads in the training process (``num_workers=0``), every ``__getitem__`` call runs in
the traced main thread and, with ``with_stack``, the Python tracer records it as a frame event
(``data.py(42): __getitem__``) with the calls it makes as its children (``torch.manual_seed``,
``PIL.Image.open``, a helper of the script). The children's inclusive time, grouped by readable name,
says which lines of ``__getitem__`` cost most: the fix a data-loading finding names when more workers
cannot help. (Worker processes are not traced: with ``num_workers > 0`` this section is empty.)

Durations are as recorded, so a pure-Python child is inflated by the tracer like its parent; the
shares between children are what the finding uses.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import numpy as np

from torchscope.analysis.frames import is_interpreter_or_torch_code, readable
from torchscope.analysis.reduce import merge_sections
from torchscope.analysis.registry import Analysis, Part
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.report.measurements import Getitem
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

_GETITEM = re.compile(r"^[^()]*\(\d+\): (__getitem__|__getitems__)$")
# torch's single-process fetch (`torch/utils/data/_utils/fetch.py: fetch`): it calls the dataset's
# __getitem__ (in a list comprehension, or __getitems__) and then the collate_fn on the samples.
_FETCH = re.compile(r"(^|/)torch/utils/data/_utils/fetch\.py\(\d+\): fetch$")
_NOT_COLLATE = re.compile(r"\(\d+\): (<listcomp>|<genexpr>|__getitem__|__getitems__|__len__)$|^<built-in")  # fetch's hasattr
MAX_CALLS = 8  # the costliest calls kept per span


def _is_dataset_getitem(name: str) -> bool:
    """A dataset's `__getitem__`: not the interpreter's or the standard library's (`os.environ`,
    `UserDict`, an Enum), nor torch's (`ModuleList[i]` in a forward; Subset and ConcatDataset, whose child
    is the wrapped dataset's frame), whether the path is absolute or, as PyTorch's tracer writes it,
    relative to its sys.path entry (`torch/nn/modules/container.py`). A dataset in site-packages
    (torchvision) counts. A named predicate, not a lambda: `EventTable.name_mask` keeps its answers."""
    return _GETITEM.match(name) is not None and not is_interpreter_or_torch_code(name)


def extract(span: SpanInput) -> Optional[Getitem]:
    """The ``__getitem__`` frames of one span and their costliest direct calls, per step."""
    steps = len(span.steps)
    events = span.events
    python = events.kind_mask(Kind.PYTHON_FUNCTION)
    if steps == 0 or not python.any():
        return None
    frames = np.flatnonzero(python & events.name_mask(_is_dataset_getitem))
    frames = frames[event_steps(events, span.steps)[frames] >= 0]
    collate = _collate_calls(events, span, python)
    if frames.size == 0 and collate.size == 0:
        return None
    parent = span.tree.parent
    outermost = frames[~np.isin(parent[frames], frames)]  # a __getitem__ calling another one counts once
    children = np.flatnonzero(np.isin(parent, outermost) & events.kind_mask((Kind.PYTHON_FUNCTION, Kind.CPU_OP)))
    totals = _by_readable_name(events, children, steps)
    frame_totals = _by_readable_name(events, outermost, 1)
    names = sorted(frame_totals, key=lambda name: (-frame_totals[name], name))  # costliest first: the finding names it
    return Getitem(
        frames=names,
        calls_per_step=float(outermost.size / steps),
        getitem_us_per_step=float(events.dur_us[outermost].sum() / steps),
        calls_us_per_step=dict(sorted(totals.items(), key=lambda kv: -kv[1])[:MAX_CALLS]),
        collate_us_per_step=_by_readable_name(events, collate, steps),
    )


def _collate_calls(events: EventTable, span: SpanInput, python: np.ndarray) -> np.ndarray:
    """The collate_fn calls of the main-process fetches inside the steps: the Python calls torch's fetch
    makes that are neither its comprehension over the dataset nor a __getitem__."""
    fetches = python & events.name_mask(_is_torch_fetch)
    if not fetches.any():
        return np.zeros(0, dtype=np.int64)
    parent = span.tree.parent
    calls = np.flatnonzero(python & fetches[np.maximum(parent, 0)] & (parent >= 0) & ~events.name_mask(_is_not_collate))
    return calls[event_steps(events, span.steps)[calls] >= 0]


def _is_torch_fetch(name: str) -> bool:
    return _FETCH.search(name) is not None


def _is_not_collate(name: str) -> bool:
    return _NOT_COLLATE.search(name) is not None


def _by_readable_name(events: EventTable, rows: np.ndarray, per: int) -> dict[str, float]:
    """The duration of `rows`, divided by `per`, summed by readable name (two names can read the same)."""
    totals: dict[str, float] = {}
    for name_id, us in zip(*_sum_by(events.name[rows], events.dur_us[rows])):
        key = readable(events.strings[int(name_id)])
        totals[key] = totals.get(key, 0.0) + float(us) / per
    return totals


def _sum_by(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, np.bincount(inverse, weights=values, minlength=unique.size)


def _reduce(parts: list[Part[Optional[Getitem]]]) -> dict[str, Any]:
    return {"measurements.getitem": merge_sections(parts, Getitem)}


GETITEM = Analysis(
    name="getitem", extract=extract, extract_type=Optional[Getitem], reduce=_reduce, fills=("measurements.getitem",)
)
