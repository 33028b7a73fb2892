"""Hooks the user's code registered on modules (`register_forward_hook`, `register_forward_pre_hook`), and
the time they take per step, from the recorded stacks.

torch's module call (`torch/nn/modules/module.py: _call_impl`, and its `inner` where hooks are set) runs a
module's pre-hooks, its `forward` and its hooks: the user's own frames called from there, other than the
`forward` methods, are the hooks. Activation statistics, logging, feature capture: often a few `.item()`
calls on every module of every step (one device sync each on a GPU). Without stacks nothing is seen.
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis.frames import is_user_frame, readable_totals
from torchscope.analysis.nesting import HostTree
from torchscope.analysis.span import SpanInput
from torchscope.analysis.steps import event_steps
from torchscope.arrays import group_ids
from torchscope.report.measurements import ModuleHooks
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

_MODULE_CALL = re.compile(r"(^|/)torch/nn/modules/module\.py\(\d+\): (_call_impl|inner|_wrapped_call_impl)$")
MAX_HOOKS = 5


def _is_module_call_machinery(name: str) -> bool:
    return _MODULE_CALL.search(name) is not None


def _is_forward_method(name: str) -> bool:
    return name.endswith("): forward")


def hook_rows(events: EventTable, tree: HostTree) -> np.ndarray:
    """The rows of the user's hook frames: their own code (not a `forward` method) called by torch's module
    call. Once per table (read-only)."""

    def compute() -> np.ndarray:
        python = events.kind_rows(Kind.PYTHON_FUNCTION)
        user = python[events.name_mask(is_user_frame, python) & ~events.name_mask(_is_forward_method, python)]
        parent = tree.parent[user]
        rows = user[(parent >= 0) & events.name_mask(_is_module_call_machinery, np.maximum(parent, 0))]
        rows.setflags(write=False)
        return rows

    return events.memo("module_hook_rows", compute)


def module_hooks(span: SpanInput) -> ModuleHooks | None:
    """The user's hook frames inside the steps, per step (None: none)."""
    events = span.events
    if len(span.steps) == 0:
        return None
    hooks = hook_rows(events, span.tree)
    hooks = hooks[event_steps(events, span.steps)[hooks] >= 0]
    if hooks.size == 0:
        return None
    n = len(span.steps)
    names, group = group_ids(events.name[hooks])
    totals = np.bincount(group, events.dur_us[hooks], names.size) / n
    by_name = readable_totals({events.strings[int(i)]: float(us) for i, us in zip(names.tolist(), totals.tolist())})
    return ModuleHooks(
        calls_per_step=float(hooks.size / n),
        hooks_us_per_step=float(events.dur_us[hooks].sum() / n),
        hooks_us_by_name=dict(list(by_name.items())[:MAX_HOOKS]),
    )
