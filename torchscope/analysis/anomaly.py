"""What autograd's anomaly detection (`torch.autograd.set_detect_anomaly(True)`, `detect_anomaly()`) costs
a step, from the events it leaves in the trace.

Anomaly mode does two things, both visible in a Kineto trace:

* **A NaN check after every backward node** (unless `check_nan=False`): the autograd engine runs
  `isnan(output)._is_any_true().item()` on each output of each node, inside the node's
  `autograd::engine::evaluate_function: XBackward0` range, beside the node's own range. Other operators
  run there too (the input buffer's accumulation, the user's tensor hooks), so the checks are taken where
  all three of `aten::isnan`, `aten::_is_any_true` and `aten::item` sit under one such range: a hook calling
  `isnan` or `.item()` alone is not anomaly mode. On a GPU each `.item()` copies to the host and waits for
  the device: a synchronisation per node. Recorded with or without stacks.
* **A Python stack saved for every autograd node the forward creates**: the node's constructor, inside
  the operator (`aten::addmm`), calls `torch.fx.traceback.format_stack()`. With stacks recorded it is a
  Python frame whose parent is that operator; without, its time hides in the operator's self time and is
  not measured here.
"""

from __future__ import annotations

import re

import numpy as np

from torchscope.analysis.compilation import inside_compilation
from torchscope.analysis.nesting import HostTree, nearest_ancestor_of
from torchscope.analysis.steps import StepWindows, event_steps
from torchscope.report.measurements import ANOMALY_CHECK, AnomalyMode
from torchscope.trace.kinds import Kind
from torchscope.trace.tables import EventTable

_CHECK_OPS = frozenset({"aten::isnan", "aten::_is_any_true", "aten::item"})
_STACK_CAPTURE = re.compile(r"(^|/)torch/fx/traceback\.py\(\d+\): format_stack$")


def _is_engine_node(name: str) -> bool:
    return name.startswith("autograd::engine::evaluate_function: ")


def _is_check_op(name: str) -> bool:
    return name in _CHECK_OPS


def _is_isnan(name: str) -> bool:
    return name == "aten::isnan"


def _is_any_true(name: str) -> bool:
    return name == "aten::_is_any_true"


def _is_item(name: str) -> bool:
    return name == "aten::item"


def _is_stack_capture(name: str) -> bool:
    return _STACK_CAPTURE.search(name) is not None


def check_rows(events: EventTable, tree: HostTree) -> np.ndarray:
    """The rows of anomaly mode's NaN-check operators (ascending): `aten::isnan`, `aten::_is_any_true`
    and `aten::item` whose parent is an autograd engine node's range. Computed once per table."""

    def compute() -> np.ndarray:
        ops = events.kind_rows(Kind.CPU_OP)
        candidates = ops[events.name_mask(_is_check_op, ops)]
        parent = tree.parent[candidates]
        has_parent = parent >= 0
        candidates, parent = candidates[has_parent], parent[has_parent]
        under_node = events.name_mask(_is_engine_node, parent)
        candidates, parent = candidates[under_node], parent[under_node]
        # The three together under one node: a hook of the user's may call isnan or item there alone.
        found = np.zeros(len(events) if candidates.size else 0, dtype=np.uint8)
        for predicate in (_is_isnan, _is_any_true, _is_item):
            has = np.zeros(found.size, dtype=bool)
            has[parent[events.name_mask(predicate, candidates)]] = True
            found += has
        rows = candidates[found[parent] == 3] if candidates.size else candidates
        rows.setflags(write=False)
        return rows

    return events.memo("anomaly_check_rows", compute)


def under_checks(events: EventTable, tree: HostTree, rows: np.ndarray) -> np.ndarray:
    """Per row of `rows`: whether it runs inside a NaN check (the device sync of its `.item()`)."""
    checks = check_rows(events, tree)
    if checks.size == 0 or rows.size == 0:
        return np.zeros(rows.size, dtype=bool)
    mask = np.zeros(len(events), dtype=bool)
    mask[checks] = True
    return nearest_ancestor_of(tree, mask)[rows] >= 0


def anomaly_mode(events: EventTable, steps: StepWindows, tree: HostTree) -> AnomalyMode | None:
    """Anomaly mode's NaN checks and stack captures inside the steps, per step (None: neither found)."""
    checks = check_rows(events, tree)
    python = events.kind_rows(Kind.PYTHON_FUNCTION)
    captures = python[events.name_mask(_is_stack_capture, python)]
    if captures.size:  # called from C++ inside the operator that creates the node, not from Python code
        parent = tree.parent[captures]
        captures = captures[(parent >= 0) & (events.kind[np.maximum(parent, 0)] == Kind.CPU_OP)]
        # AOTAutograd traces the backward under detect_anomaly(check_nan=False) to keep each node's stack:
        # that is torch.compile compiling, not the user's anomaly mode.
        captures = captures[~inside_compilation(events, captures)]
    if checks.size == 0 and captures.size == 0 or len(steps) == 0:
        return None
    step_of = event_steps(events, steps)
    checks, captures = checks[step_of[checks] >= 0], captures[step_of[captures] >= 0]
    n = len(steps)
    return AnomalyMode(
        nan_checks_per_step=float(np.count_nonzero(events.name_mask(_is_isnan, checks)) / n),
        nan_check_us_per_step=float(events.dur_us[checks].sum() / n),
        stack_captures_per_step=float(captures.size / n),
        stack_capture_us_per_step=float(events.dur_us[captures].sum() / n),
    )
