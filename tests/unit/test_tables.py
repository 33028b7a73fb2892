"""EventTable helpers on real traces: name masks equal a per-event check of each name."""

from __future__ import annotations

import numpy as np

from helpers.real_traces import TraceSet
from torchscope.trace.kinds import Kind
from torchscope.trace.parse import parse_trace


def test_name_mask_matches_each_events_name_and_asks_only_about_names(real_traces: TraceSet) -> None:
    path = real_traces.file("resnet50_num_workers_0")
    events = parse_trace(path).events
    asked: list[str] = []

    def predicate(name: str) -> bool:
        asked.append(name)
        return name.startswith("aten::") or "gemm" in name

    per_event = np.array([predicate(events.strings[i]) for i in events.name.tolist()])
    asked.clear()
    assert np.array_equal(events.name_mask(predicate), per_event)
    names = {events.strings[i] for i in events.name.tolist()}
    assert len(asked) == len(set(asked)) == len(names) < len(events.strings)  # once per name, names only

    kernels = np.flatnonzero(events.kind == Kind.KERNEL)
    assert kernels.size
    asked.clear()
    assert np.array_equal(events.name_mask(predicate, kernels), per_event[kernels])
    assert set(asked) == {events.strings[i] for i in events.name[kernels].tolist()}
