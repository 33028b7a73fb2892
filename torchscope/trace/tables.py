"""Columnar trace tables: typed numpy columns and one interned string table per trace.

An `EventTable` is what every analysis reads. Strings (names, categories, pids/tids, stacks, shapes) are
stored once in `strings` and referenced by int32 ids; id 0 is always the empty string.
"""

from __future__ import annotations

from types import FunctionType
from typing import Any

import msgspec
import numpy as np

from torchscope.arrays import read_only
from torchscope.trace.kinds import Kind, kind_mask

# Column name -> dtype. Times are microseconds, as in the Chrome trace format.
NUMERIC_COLUMNS: dict[str, Any] = {
    "ts_us": np.float64,
    "dur_us": np.float64,
    "flow_id": np.int64,
    "external_id": np.int64,
    "correlation": np.int64,
    # Narrow types where the values are small (ids, counts, ratios): columns exist for every event.
    "stream": np.int32,
    "device": np.int32,
    "nbytes": np.int64,
    "bandwidth_gbps": np.float32,
    "registers_per_thread": np.int32,
    "blocks_per_sm": np.float32,
    "occupancy_pct": np.float32,
    "mem_bytes": np.int64,
    "total_allocated": np.int64,
    "total_reserved": np.int64,
    "device_type": np.int32,
    "device_id": np.int32,
    "addr": np.int64,
    "group_size": np.int32,
    "in_nelems": np.int64,
    "out_nelems": np.int64,
    "seq": np.int64,
}
STRING_COLUMNS: tuple[str, ...] = (
    "ph",
    "cat",
    "name",
    "pid",
    "tid",
    "input_dims",
    "input_type",
    "call_stack",
    "grid",
    "block",
    "label",
    "concrete_inputs",
    "comm_name",
    "pg_name",
    "comm_dtype",
)
DERIVED_COLUMNS: dict[str, Any] = {"kind": np.int8}
# Columns that only some events carry are kept as `sparse.SparseColumn`s (the rows that carry a value,
# and the values), not one value per event: the collectives' args (a few events a step) and the
# `[memory]` events' (40 bytes an event for all six; the columns share one row array, so they cost less
# than dense ones unless over 80 % of the events are `[memory]` events). `concrete_inputs` stays dense:
# PyTorch 2.x writes `Concrete Inputs` on every op when shapes are recorded, and a sparse row costs 12
# bytes where a dense one costs 4.
SPARSE_COLUMNS: frozenset[str] = frozenset((
    "comm_name", "pg_name", "comm_dtype", "group_size", "in_nelems", "out_nelems", "seq",
    "mem_bytes", "total_allocated", "total_reserved", "device_type", "device_id", "addr",
))
ALL_COLUMNS: tuple[str, ...] = (*NUMERIC_COLUMNS, *STRING_COLUMNS, *DERIVED_COLUMNS)


class StringInterner(dict[Any, int]):
    """Maps a value to a dense int id; `map(interner.__getitem__, values)` runs at C speed."""

    def __init__(self) -> None:
        super().__init__()
        self.strings: list[str] = []
        self[""]  # id 0 is the empty string

    def __missing__(self, key: Any) -> int:
        index = len(self.strings)
        self.strings.append(key if isinstance(key, str) else _to_text(key))
        self[key] = index
        return index


def _to_text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class EventTable(msgspec.Struct, dict=True):
    """All events of one trace file as columns of equal length (numpy arrays; those of SPARSE_COLUMNS
    are `sparse.SparseColumn`s, which index like them)."""

    # dict=True: `memo` keeps derived values in the instance __dict__ (the fields live in slots).

    columns: dict[str, Any]
    strings: list[str]

    def __len__(self) -> int:
        return int(len(self.columns["ts_us"]))

    def __getattr__(self, name: str) -> np.ndarray:
        if name == "columns":  # an unset slot (never, once built): no recursion through self.columns
            raise AttributeError(name)
        try:
            return self.columns[name]
        except KeyError:
            raise AttributeError(name) from None

    def text(self, ids: np.ndarray | int) -> Any:
        """Strings for ids (a list for an array, a str for a scalar)."""
        if isinstance(ids, (int, np.integer)):
            return self.strings[int(ids)]
        return [self.strings[i] for i in np.asarray(ids).tolist()]

    def kind_mask(self, kinds: "Kind | tuple[Kind, ...]") -> np.ndarray:
        """Per event: whether its kind is one of `kinds` (read-only: kept per table once asked again, as
        the same few sets are, e.g. host ranges, device, runtime)."""
        wanted = _kinds_key(kinds)
        return self.memo_if_asked_again(f"kind_mask:{wanted}", lambda: read_only(kind_mask(self.kind, wanted)))

    def kind_rows(self, kinds: "Kind | tuple[Kind, ...]") -> np.ndarray:
        """The rows (ascending event indices) of the events of `kinds`, e.g. `kind_rows(DEVICE_KINDS)`
        (read-only: kept per table once asked again)."""
        wanted = _kinds_key(kinds)
        return self.memo_if_asked_again(f"kind_rows:{wanted}", lambda: read_only(np.flatnonzero(self.kind_mask(wanted))))

    def thread_keys(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Per event (or per event of `rows`): its thread as one int64, `pid << 32 | tid` of their string
        ids."""
        pid, tid = (self.pid, self.tid) if rows is None else (self.pid[rows], self.tid[rows])
        return (pid.astype(np.int64) << 32) | tid.astype(np.int64)

    def thread_rows(self, key: int) -> np.ndarray:
        """The rows (ascending) of the events of one thread, by its `thread_keys` value (two int32
        comparisons, no int64 key column)."""
        return np.flatnonzero((self.pid == int(key) >> 32) & (self.tid == int(key) & 0xFFFFFFFF))

    def name_mask(self, predicate: Any, rows: np.ndarray | None = None) -> np.ndarray:
        """Per event (or per event of `rows`): whether its name matches `predicate`.

        The predicate runs once per distinct name of those events, not over the whole string table
        (which also holds shapes, stacks and thread names, often several times as many strings)."""
        names = self.name if rows is None else self.name[rows]
        # The distinct ids from a count per id (ids are below len(strings)): one pass, not a sort of the rows.
        present = self.memo("name_ids", lambda: np.flatnonzero(np.bincount(self.name))) if rows is None else np.flatnonzero(np.bincount(names))
        strings = self.strings
        known = self._known_names(predicate)
        if known is None:
            lookup, new = np.zeros(len(strings), dtype=bool), present
        else:  # a named function: its answers are kept per string, asked again only for new ones
            lookup, evaluated = known
            new = present[~evaluated[present]]
            evaluated[new] = True
        lookup[new] = np.fromiter((bool(predicate(strings[i])) for i in new.tolist()), bool, new.size)
        return _gather(lookup, present, names)

    def _known_names(self, predicate: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """(answer, evaluated) per string for a module-level function without a closure, which is taken to
        answer the same for the same name (the same predicates, e.g. `is_user_frame`, come back from several
        analyses); None for a lambda or a closure (a new object each call, nothing to share)."""
        if not isinstance(predicate, FunctionType) or predicate.__closure__ is not None or predicate.__name__ == "<lambda>":
            return None
        known: dict[Any, tuple[np.ndarray, np.ndarray]] = self.memo("name_predicates", dict)
        if predicate not in known or known[predicate][0].size != len(self.strings):
            known[predicate] = (np.zeros(len(self.strings), dtype=bool), np.zeros(len(self.strings), dtype=bool))
        return known[predicate]

    def memo(self, key: str, compute: Any) -> Any:
        """A derived value computed once per table (several analyses ask for the same masks)."""
        cache = self.__dict__.setdefault("_memo", {})
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def memo_if_asked_again(self, key: str, compute: Any) -> Any:
        """`memo` for values that cost memory per event: kept only from their second use on, so a value
        asked once holds no memory after it (computed twice when asked again, then never again). Both
        uses share what they get: it must be read-only."""
        cache = self.__dict__.setdefault("_memo", {})
        if key in cache:
            return cache[key]
        asked: set[str] = self.__dict__.setdefault("_asked_once", set())
        value = compute()
        if key in asked:
            cache[key] = value
        asked.add(key)
        return value


# A mask of the events of a few names is cheaper as one comparison per name than as a gather through the
# lookup table: 0.025 ms a comparison against 0.25 ms for the gather, over 170k int32 ids. Most predicates
# match no name or a few (40 of the 50 asked per analysed trace match 3 or fewer).
_COMPARE_AT_MOST = 6


def _gather(lookup: np.ndarray, present: np.ndarray, names: np.ndarray) -> np.ndarray:
    """`lookup[names]`, given the distinct values `present` of `names`."""
    matching = present[lookup[present]]
    if matching.size > _COMPARE_AT_MOST:
        return np.take(lookup, names)
    mask = np.zeros(names.size, dtype=bool)
    for name in matching.tolist():
        mask |= names == name
    return mask


def _kinds_key(kinds: "Kind | tuple[Kind, ...]") -> tuple[Kind, ...]:
    """One key per set of kinds, whatever their order or repeats."""
    return tuple(sorted(set(kinds if isinstance(kinds, tuple) else (kinds,))))


class TraceFile(msgspec.Struct):
    """One parsed trace file: its header (everything but `traceEvents`) and its events."""

    path: str
    header: dict[str, Any]
    events: EventTable
    warnings: list[str] = msgspec.field(default_factory=list)
