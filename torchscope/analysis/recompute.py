"""Activation checkpointing's recomputation: the forward run again inside the backward.

`torch.utils.checkpoint` keeps a block's inputs instead of its activations and runs the block's forward
again when the backward needs them, so module calls (`nn.Module: Block_0`, recorded with stacks or the
module-level record_function) appear inside the backward phase. Nothing else calls modules there in an
ordinary training step. Their time is what checkpointing costs each step in exchange for the memory it
saves: host time on a CPU, the kernels' device time on a GPU.
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.frames import is_module_call, readable_totals
from torchscope.analysis.nesting import nearest_ancestor_of
from torchscope.analysis.span import SpanInput
from torchscope.arrays import group_ids
from torchscope.report.measurements import Recompute
from torchscope.trace.kinds import Kind

MAX_MODULES = 5


_CHECKPOINT_FRAME = re.compile(r"(^|/)torch/utils/checkpoint\.py\(\d+\): ")


def _is_checkpoint_frame(name: str) -> bool:
    return _CHECKPOINT_FRAME.search(name) is not None


def recompute(span: SpanInput) -> Recompute | None:
    """The outermost module calls that start inside the backward phase, per step (None: none)."""
    events = span.events
    backward = span.phase_sets.get("backward")
    if backward is None or backward[0].size == 0 or len(span.steps) == 0:
        return None
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    calls = python[events.name_mask(is_module_call, python)]
    if calls.size == 0:
        return None
    calls = calls[intervals.contains(backward, events.ts_us[calls])]
    if calls.size == 0:
        return None
    inside = np.zeros(len(events), dtype=bool)
    inside[calls] = True
    # Outermost: a recomputed block's own submodules are inside its time already.
    parent = span.tree.parent[calls]
    enclosed = np.zeros(calls.size, dtype=bool)
    ancestors = parent.copy()
    while (live := ancestors >= 0).any():
        enclosed[live] |= inside[ancestors[live]]
        ancestors[live] = span.tree.parent[ancestors[live]]
    outermost = calls[~enclosed]
    cost = span.times.device_total_us[outermost] if span.has_device else events.dur_us[outermost]
    n = len(span.steps)
    # With stacks, checkpoint's own Python (saving inputs, the saved-tensor hooks, re-entering the block)
    # in the steps, outside the modules it runs: host time, forward and backward.
    frames = python[events.name_mask(_is_checkpoint_frame, python)]
    modules = python[events.name_mask(is_module_call, python)]
    if frames.size:  # the modules checkpoint runs (not the model's call around it)
        in_checkpoint = np.zeros(len(events), dtype=bool)
        in_checkpoint[frames] = True
        modules = modules[nearest_ancestor_of(span.tree, in_checkpoint)[modules] >= 0]
    steps = intervals.union(span.steps.start_us, span.steps.end_us)
    bookkeeping = intervals.subtract(
        intervals.intersect(intervals.union(events.ts_us[frames], events.ts_us[frames] + events.dur_us[frames]), steps),
        intervals.union(events.ts_us[modules], events.ts_us[modules] + events.dur_us[modules]),
    )
    names, group = group_ids(events.name[outermost])
    totals = np.bincount(group, cost, names.size) / n
    modules = readable_totals({events.strings[int(i)]: float(us) for i, us in zip(names.tolist(), totals.tolist())})
    return Recompute(
        recomputed_calls_per_step=float(outermost.size / n),
        recompute_us_per_step=float(cost.sum() / n),
        bookkeeping_us_per_step=intervals.total_length(bookkeeping) / n,
        modules_us_per_step=dict(list(modules.items())[:MAX_MODULES]),
        time_base="device" if span.has_device else "host",
    )
