"""`SpanInput`: one trace file's tables with the intermediate results several analyses share (step
windows, host call tree, operator times, breakdowns, device activity), each computed on first use."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from torchscope.analysis import intervals
from torchscope.analysis.arithmetic import Arithmetic, arithmetic
from torchscope.analysis.breakdown import StepBreakdown, device_breakdown, phase_partition
from torchscope.analysis.device import DeviceActivity, analyze_device
from torchscope.analysis.nesting import HostTree, host_tree
from torchscope.analysis.operators import OpTimes, op_times
from torchscope.analysis.step_kinds import training_steps
from torchscope.analysis.steps import StepWindows, find_steps
from torchscope.trace.kinds import DEVICE_KINDS
from torchscope.trace.tables import EventTable, TraceFile


class SpanInput:
    """What an analysis's `extract` reads: one trace file (a "span": one schedule cycle of one rank)."""

    def __init__(self, trace: TraceFile) -> None:
        self.trace = trace
        self.events: EventTable = trace.events
        self.header: dict[str, Any] = trace.header

    @property
    def file(self) -> str:
        return self.trace.path

    @property
    def name(self) -> str:
        return Path(self.trace.path).name

    @cached_property
    def steps(self) -> StepWindows:
        """The training steps (evaluation steps beside them are left out: analysis/step_kinds.py)."""
        return training_steps(self.events, find_steps(self.events))

    @cached_property
    def tree(self) -> HostTree:
        return host_tree(self.events)

    @cached_property
    def times(self) -> OpTimes:
        return op_times(self.events, self.tree)

    @cached_property
    def arithmetic(self) -> Arithmetic:
        """Main-thread matmul units and the leaves outside them: where a CPU step's arithmetic runs."""
        return arithmetic(self.events, self.tree, self.times)

    @cached_property
    def has_device(self) -> bool:
        return bool(self.events.kind_rows(DEVICE_KINDS).size)

    @cached_property
    def device_breakdown(self) -> StepBreakdown:
        return device_breakdown(self.events, self.steps)

    @cached_property
    def _phases(self) -> tuple[StepBreakdown, dict[str, intervals.IntervalSet]]:
        return phase_partition(self.events, self.steps)

    @property
    def phase_breakdown(self) -> StepBreakdown:
        return self._phases[0]

    @property
    def phase_sets(self) -> dict[str, intervals.IntervalSet]:
        """The time attributed to each host phase (incl. "other"), as interval sets."""
        return self._phases[1]

    @cached_property
    def compute_set(self) -> intervals.IntervalSet:
        """Forward and backward time together."""
        forward, backward = self.phase_sets["forward"], self.phase_sets["backward"]
        return intervals.union(np.concatenate([forward[0], backward[0]]), np.concatenate([forward[1], backward[1]]))

    @cached_property
    def device(self) -> DeviceActivity:
        return analyze_device(self.events, self.steps, self.times, self.tree, self.header)
