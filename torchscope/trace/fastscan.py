"""The compiled batch scanner (`_fastscan.c`): event batches from JSON text straight into columns.

Why: on the msgspec path each event becomes a Python struct and each value passes through
`numpy.fromiter` (together about 3 us an event); the scanner reads the text once in C and writes every
declared field into a C array, so a batch costs no Python object per event. Strings go through the same
`StringInterner` as on the msgspec path, once per distinct text.

It only accepts batches in the strict shape the msgspec path decodes without coercion and returns None
for anything else; the caller then decodes that batch with msgspec. So results are the same either way,
and where the extension could not be built (no C compiler at install time) everything still works, only
slower. Set TORCHSCOPE_NO_FASTSCAN=1 to force the msgspec path (for comparison and tests).
"""

from __future__ import annotations

import math
import os
from typing import Any

import msgspec
import numpy as np

from torchscope.trace import schema
from torchscope.trace.tables import NUMERIC_COLUMNS, STRING_COLUMNS

SPEC_VERSION = 3  # must match _fastscan.c's SPEC_VERSION (field spec and output layout)

try:
    from torchscope.trace import _fastscan  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the msgspec path does all the work
    _fastscan = None
if _fastscan is not None and getattr(_fastscan, "SPEC_VERSION", None) != SPEC_VERSION:
    _fastscan = None  # a stale build from another version of the C source: msgspec rather than garbage

DISABLE_ENV = "TORCHSCOPE_NO_FASTSCAN"


def available() -> bool:
    """Whether batches go through the compiled scanner (built, and not disabled by DISABLE_ENV)."""
    return _fastscan is not None and os.environ.get(DISABLE_ENV, "") in ("", "0")


class _Field(msgspec.Struct, frozen=True):
    column: str  # the table column it fills (external_id_lower: a scratch column, see columns.py)
    key: str  # the JSON key, in the event or in its `args`
    in_args: bool
    type: str  # the scanner's type name, see _fastscan.c
    default: float  # numeric default (the column's "absent" value)
    default_key: Any  # for interned columns: the interner key of the absent value
    dtype: Any


def _arg_field(column: str, key: str, kind: Any, default: Any) -> _Field:
    if kind is msgspec.Raw:
        return _Field(column, key, True, "T_RAW", 0.0, bytes(default), np.int32)
    if kind is str:
        return _Field(column, key, True, "T_STR", 0.0, default, np.int32)
    dtype = NUMERIC_COLUMNS.get(column, np.int64)
    if kind is float:
        return _Field(column, key, True, "T_F4" if dtype == np.float32 else "T_F8", float(default), None, dtype)
    if kind is schema.Int32:
        return _Field(column, key, True, "T_I4", float(default), None, np.int32)
    if kind is schema.Int64:
        return _Field(column, key, True, "T_I8", float(default), None, np.int64)
    raise TypeError(f"no scanner type for args field {column!r} ({kind!r})")


# The event's own fields mirror schema.Event (same keys, types and defaults); `args` mirror ARG_FIELDS.
FIELDS: tuple[_Field, ...] = (
    _Field("ph", "ph", False, "T_STR", 0.0, "", np.int32),
    _Field("cat", "cat", False, "T_STR", 0.0, "", np.int32),
    _Field("name", "name", False, "T_STR", 0.0, "", np.int32),
    _Field("pid", "pid", False, "T_KEY", 0.0, 0, np.int32),
    _Field("tid", "tid", False, "T_KEY", 0.0, 0, np.int32),
    _Field("ts_us", "ts", False, "T_F8", math.nan, None, np.float64),
    _Field("dur_us", "dur", False, "T_F8", math.nan, None, np.float64),
    _Field("flow_id", "id", False, "T_FLOW", -1.0, None, np.int64),
    _Field("", "args", False, "T_ARGS", 0.0, None, None),
    *(_arg_field(column, key, kind, default) for column, (key, kind, default) in schema.ARG_FIELDS.items()),
)
assert {f.column for f in FIELDS} >= {*NUMERIC_COLUMNS, *STRING_COLUMNS}, "a table column the scanner skips"


class ScannedBatch(msgspec.Struct):
    """One batch as columns: every field of FIELDS, read from every event (columns.py then keeps each
    args column only for the event kinds that carry it, as on the msgspec path)."""

    count: int
    columns: dict[str, np.ndarray]



class BatchScanner:
    """The compiled scanner bound to one interner; counts the batches it decoded and declined."""

    def __init__(self, interner: dict[Any, int]) -> None:
        if _fastscan is None:
            raise RuntimeError("torchscope.trace._fastscan is not built")
        spec = [(f.key, f.in_args, getattr(_fastscan, f.type), f.default, f.default_key) for f in FIELDS]
        self._scanner = _fastscan.Scanner(interner, spec)
        self.scanned = 0
        self.declined = 0

    def scan(self, text: bytes, items: tuple[int, int] | None = None) -> ScannedBatch | None:
        """The batch's columns, or None when the text is not in the strict shape (decode it with msgspec).

        `items` = (start, end): scan text[start:end] as an array's comma-separated events, without its
        brackets (no copy of the slice is made)."""
        result = self._scanner.scan(text) if items is None else self._scanner.scan(text, *items)
        if result is None:
            self.declined += 1
            return None
        self.scanned += 1
        count, buffers = result
        columns = {f.column: np.frombuffer(buffer, f.dtype) for f, buffer in zip(FIELDS, buffers) if f.dtype}
        return ScannedBatch(count, columns)
