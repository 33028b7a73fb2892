"""ColumnBuilder: appended parts (byte ranges) and decoded batches make the same table in any mix."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.real_traces import TraceSet
from torchscope.trace.columns import ColumnBuilder
from torchscope.trace.parse import Batch, batch_decoder
from torchscope.trace.read import read_trace_bytes
from torchscope.trace.stream import EventStream
from torchscope.trace.tables import EventTable


def _batches(data: bytes, builder: ColumnBuilder) -> list[Batch]:
    chunks = [data[i : i + (64 << 10)] for i in range(0, len(data), 64 << 10)]
    return list(EventStream(iter(chunks), batch_decoder(builder), 64 << 10).batches())


def _same(a: EventTable, b: EventTable) -> None:
    assert a.strings == b.strings
    for name in a.columns:
        assert a.columns[name].tobytes() == b.columns[name].tobytes(), name


@pytest.mark.parametrize("split", [0.0, 0.5, 1.0])
def test_appended_parts_then_batches_equal_batches_alone(real_traces: TraceSet, split: float) -> None:
    """Appending parts allocates columns without defaults (parts write every column); a batch added
    after that relies on defaults, which must then be in place for the rows not written yet."""
    path = real_traces.file("resnet50_num_workers_0")
    data = read_trace_bytes(path)
    reference = ColumnBuilder(len(data))
    for batch in _batches(data, reference):
        reference.add_batch(batch, 0)
    expected = reference.finish([])[0]

    first = ColumnBuilder(None)
    batches = _batches(data, first)
    cut = int(len(batches) * split)
    for batch in batches[:cut]:
        first.add_batch(batch, 0)
    mixed = ColumnBuilder(len(data))
    columns, keys, dropped = first.parts()
    mixed.append(columns, keys, dropped, len(data) // 2)
    assert not mixed.prefilled  # allocated without defaults
    for batch in _batches(data, mixed)[cut:]:  # the rest, decoded against the mixed builder's interner
        mixed.add_batch(batch, len(data))
    _same(mixed.finish([])[0], expected)
    assert np.all(np.isfinite(expected.ts_us))
