"""Capture around a model the user compiled: torchscope's global module hooks must not break dynamo's
graphs (a break per module call changes the user's performance, the one thing a profiler must not do),
and the phases are still labelled from the compiled module's outer call."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import torchscope

torch = pytest.importorskip("torch")


def test_a_compiled_model_keeps_its_graph_under_capture(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    compiled = torch.compile(model, backend="eager")  # dynamo's tracing without inductor's slow codegen
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        # taken and compared inside catch_warnings, which restores the filters itself when it exits
        filters_before = list(warnings.filters)
        with torchscope.profile(out=tmp_path / "run") as prof:
            for _ in range(6):
                loss = compiled(torch.randn(8, 16)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                prof.step()
        filters_after = list(warnings.filters)
    assert dict(counters["graph_break"]) == {}  # was 3: threading.get_ident in the forward hooks
    # torch's warning about global module hooks is about ours: the user never sees it, and their own
    # warning filters are as they were once the capture ends
    assert not [w for w in shown if "global hooks" in str(w.message)]
    assert filters_after == filters_before
    [trace] = (tmp_path / "run").glob("*.pt.trace.json")
    names = [e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]]
    for label in ("torchscope:forward", "torchscope:backward", "torchscope:optimizer"):
        assert names.count(label) == 3, label  # one per recorded step


def test_a_compiled_graphs_operators_are_counted_once(tmp_path: Path) -> None:
    """aot_autograd runs the graph's operators from Python inside `CompiledFunction`: with stacks on, frames
    sit between them, and the operator table still gives the graph's time to those operators (host self),
    not to `CompiledFunction` as well."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    compiled = torch.compile(model, backend="aot_eager")  # aot_autograd's graphs without inductor's codegen
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with torchscope.profile(out=tmp_path / "run") as prof:
        for _ in range(6):
            loss = compiled(torch.randn(256, 256)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            prof.step()
    report = torchscope.analyze(tmp_path / "run", use_cache=False)
    rows = {row.name: row for row in report.operators}
    forward, backward = rows["CompiledFunction"], rows["CompiledFunctionBackward"]
    assert forward.calls == backward.calls == 3
    # each graph's own time is its Python around the operators; the matmuls are the addmm/mm rows'
    assert forward.host_self_us < 0.5 * forward.host_total_us
    assert backward.host_self_us < 0.5 * backward.host_total_us
    assert rows["aten::addmm"].calls == 12 and rows["aten::addmm"].host_self_us > forward.host_self_us
