"""The costly calls inside a Dataset's ``__getitem__``, from the recorded stacks (analysis/getitem.py), on a
synthetic trace: which frames count, the per-step time of their direct calls by readable name, their order."""

from __future__ import annotations

import json

import pytest

from helpers.trace_builder import TraceBuilder
from torchscope.analysis.getitem import _is_dataset_getitem, extract
from torchscope.analysis.span import SpanInput
from torchscope.trace.parse import parse_trace_bytes

DATASET = "/home/u/train/data.py(42): __getitem__"
INNER = "/home/u/train/data.py(90): __getitem__"  # a dataset wrapping another of the script's
SUBSET = "/venv/lib/python3.12/site-packages/torch/utils/data/dataset.py(412): __getitem__"
DECODE = "/home/u/train/data.py(10): decode"
SEED = "<built-in method manual_seed of torch._C.Generator object at 0x7f00deadbeef>"
SLEEP = "<built-in function sleep>"


def _frame(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.op(name, ts, dur, cat="python_function")


def _sample(b: TraceBuilder, ts: float) -> None:
    """One 300 us __getitem__: decode 120 us (holding a 100 us grandchild), manual_seed 60, aten::add 30, sleep 20."""
    _frame(b, DATASET, ts, 300)
    _frame(b, DECODE, ts + 10, 120)
    _frame(b, SLEEP, ts + 15, 100)  # decode's child, not __getitem__'s: it counts inside decode
    _frame(b, SEED, ts + 140, 60)
    b.op("aten::add", ts + 210, 30)
    _frame(b, SLEEP, ts + 250, 20)


def _trace() -> SpanInput:
    b = TraceBuilder()
    _frame(b, DATASET, 0, 300)  # before the first step: not counted
    for step in range(3):
        t0 = 1000.0 + 2000.0 * step
        b.step(step + 1, t0, 2000)
        _sample(b, t0 + 10)
        _sample(b, t0 + 400)
        # Through torch's Subset (not a dataset's frame), a dataset whose __getitem__ calls the script's
        # other one: the outer counts once, its inner frame is a direct call of it.
        _frame(b, SUBSET, t0 + 800, 500)
        _frame(b, DATASET, t0 + 810, 480)
        _frame(b, INNER, t0 + 820, 400)
        _frame(b, SEED, t0 + 830, 300)
    return SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))


def test_getitem_names_its_costly_calls_per_step_in_order() -> None:
    section = extract(_trace())
    assert section is not None
    assert section.frames == ["__getitem__ (data.py:42)"]  # INNER is inside an outer one: not a frame of its own
    assert section.calls_per_step == pytest.approx(3.0)
    assert section.getitem_us_per_step == pytest.approx(300 + 300 + 480)
    assert section.calls_us_per_step == pytest.approx(
        {"__getitem__ (data.py:90)": 400.0, "decode (data.py:10)": 240.0, "torch._C.Generator.manual_seed": 120.0,
         "aten::add": 60.0, "sleep": 40.0}
    )
    assert list(section.calls_us_per_step) == [
        "__getitem__ (data.py:90)", "decode (data.py:10)", "torch._C.Generator.manual_seed", "aten::add", "sleep",
    ]


def test_no_getitem_frames_no_section() -> None:
    b = TraceBuilder()
    b.step(1, 0, 1000)
    _frame(b, SUBSET, 10, 100)  # torch's wrapper alone is no dataset's
    _frame(b, DECODE, 200, 100)
    assert extract(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode()))) is None


# PyTorch's tracer writes a frame's path relative to its sys.path entry (torch/profiler/python_tracer.py):
# torch's and the standard library's frames then have no /torch/ or /lib/pythonX.Y/ in them.
@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("/home/u/train/data.py(42): __getitem__", True),
        ("data.py(42): __getitem__", True),  # the script's folder is a sys.path entry too
        ("torchvision/datasets/folder.py(245): __getitem__", True),  # an installed dataset is a dataset
        ("/venv/lib/python3.12/site-packages/torchvision/datasets/folder.py(245): __getitem__", True),
        ("torch/nn/modules/container.py(381): __getitem__", False),  # ModuleList[i] in a forward
        ("torch/utils/data/dataset.py(412): __getitems__", False),  # Subset
        (SUBSET, False),
        ("collections/__init__.py(1121): __getitem__", False),  # UserDict
        ("enum.py(792): __getitem__", False),  # Color["RED"]
        ("/usr/lib/python3.10/collections/__init__.py(1106): __getitem__", False),
        ("<frozen os>(674): __getitem__", False),  # os.environ
        ("/home/u/train/data.py(42): decode", False),
    ],
)
def test_which_frames_are_a_datasets_getitem(name: str, counts: bool) -> None:
    assert _is_dataset_getitem(name) is counts


def test_frames_come_costliest_first() -> None:
    cheap, costly = "/home/u/train/a_first.py(5): __getitem__", "/home/u/train/z_last.py(7): __getitem__"
    b = TraceBuilder()
    b.step(1, 0, 5000)
    _frame(b, cheap, 10, 100)
    _frame(b, "torch/nn/modules/container.py(381): __getitem__", 200, 50)
    _frame(b, costly, 300, 2000)
    section = extract(SpanInput(parse_trace_bytes(json.dumps(b.document()).encode())))
    assert section is not None
    assert section.frames == ["__getitem__ (z_last.py:7)", "__getitem__ (a_first.py:5)"]
    assert section.getitem_us_per_step == pytest.approx(2100.0)
