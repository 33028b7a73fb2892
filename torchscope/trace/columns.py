"""Decoded event structs into numpy columns: one growable set of columns per trace (`ColumnBuilder`).

Columns are allocated once from an estimate of the event count and written batch by batch; strings are
interned as they are seen; kinds are derived once per (category, phase) combination. Columns that only
some event kinds carry (kernel, memory, runtime args) are filled only for those kinds (`ARG_GROUPS`);
those that only a few events carry (`SPARSE_COLUMNS`) keep only the rows that hold a value.
"""

from __future__ import annotations

from operator import attrgetter, itemgetter
from typing import Any, Callable, Iterable

import msgspec
import numpy as np

from torchscope.arrays import distinct
from torchscope.trace import schema
from torchscope.trace.fastscan import ScannedBatch
from torchscope.trace.kinds import Kind, kind_mask, kind_of_category, kind_of_phase
from torchscope.trace.sparse import SparseColumn, share_rows
from torchscope.trace.tables import NUMERIC_COLUMNS, SPARSE_COLUMNS, STRING_COLUMNS, EventTable, StringInterner

_BASE_STRING_SOURCES = ("ph", "cat", "name", "pid", "tid")
_RAW_TEXT_COLUMNS = frozenset(c for c, (_, kind, _) in schema.ARG_FIELDS.items() if kind is msgspec.Raw)


class ColumnBuilder:
    """Columns filled batch by batch, allocated once from an estimate of the event count.

    The estimate (events per byte so far times the text size) is refined as batches come; when it falls
    short the columns grow in place (`ndarray.resize`, a realloc, no second copy at the peak), and the
    unused tail is released at the end."""

    def __init__(self, size_hint: int | None) -> None:
        self.interner = StringInterner()
        self.kinds = _KindCache(self.interner)
        self.size_hint = size_hint
        self.columns: dict[str, np.ndarray] | None = None  # the dense columns
        self.sparse = _SparseParts(self.interner)
        self.prefilled = False  # whether the rows not written yet hold each column's default
        self.filled = 0
        self.dropped = 0

    def add(self, events: list[schema.Event], dropped: int, consumed_bytes: int) -> None:
        """Append decoded events (`consumed_bytes`: text read so far, for the size estimate)."""
        self.dropped += dropped
        columns = self._reserve(self.filled + len(events), consumed_bytes)
        _fill_columns(events, self.interner, self.kinds, columns, self.sparse, self.filled)
        self.filled += len(events)

    def add_scanned(self, batch: ScannedBatch, consumed_bytes: int) -> None:
        """Append a batch from the compiled scanner, which read every field from every event: each args
        column is kept only for the event kinds that carry it (`ARG_GROUPS`), as `add` does."""
        columns = self._reserve(self.filled + batch.count, consumed_bytes)
        rows = slice(self.filled, self.filled + batch.count)
        values = batch.columns
        kind = self.kinds.kinds(values["cat"], values["ph"], values["name"])
        columns["kind"][rows] = kind
        # The reserved rows hold each column's default: a kind-specific column copies only the values of
        # the events of its kinds (one mask per distinct kind set, none when the batch has no such event).
        carriers: dict[tuple[Kind, ...], np.ndarray | None] = {}

        def carrying(kinds: tuple[Kind, ...]) -> np.ndarray | None:
            if kinds not in carriers:
                mask = kind_mask(kind, kinds)
                carriers[kinds] = mask if mask.any() else None
            return carriers[kinds]

        for name, column in values.items():
            kinds = _COLUMN_KINDS.get(name)
            if name == "external_id_lower":
                continue
            if name in SPARSE_COLUMNS:
                self.sparse.add_batch(name, column, carrying(kinds or ()), self.filled)
            elif kinds is None:
                columns[name][rows] = column
            elif (where := carrying(kinds)) is not None:
                np.copyto(columns[name][rows], column, where=where)
        # Device events of PyTorch <= 1.10 spell it "external id": the larger of the two counts, with -1
        # for the older key on the kinds that do not carry it (as on the msgspec path, every row).
        where = carrying(_COLUMN_KINDS["external_id_lower"])
        lower = -1 if where is None else np.where(where, values["external_id_lower"], -1)
        external = columns["external_id"][rows]
        np.maximum(external, lower, out=external)
        self.filled += batch.count

    def add_batch(self, batch: ScannedBatch | tuple[list[schema.Event], int], consumed_bytes: int) -> None:
        """Append a batch as either decoder gave it (see parse.batch_decoder)."""
        if isinstance(batch, ScannedBatch):
            self.add_scanned(batch, consumed_bytes)
        else:
            self.add(batch[0], batch[1], consumed_bytes)

    def append(self, part: dict[str, np.ndarray], keys: list[Any], dropped: int, consumed_bytes: int) -> None:
        """Append another builder's columns (`parts()`), mapping its string ids to this table's."""
        self.dropped += dropped
        count = len(part["ts_us"])
        columns = self._reserve(self.filled + count, consumed_bytes, defaults=False)  # parts have every column
        # Keys, not their text: as in one process, pid 1 and pid "1" stay distinct ids.
        mapping = np.fromiter(map(self.interner.__getitem__, keys), np.int32, len(keys))
        rows = slice(self.filled, self.filled + count)
        for name, values in part.items():
            if isinstance(values, SparseColumn):
                carried = mapping[values.values] if name in STRING_COLUMNS else values.values
                self.sparse.add(name, values.rows + self.filled, carried, filtered=True)
            else:
                columns[name][rows] = mapping[values] if name in STRING_COLUMNS else values
        self.filled += count

    def _reserve(self, needed: int, consumed_bytes: int, defaults: bool = True) -> dict[str, np.ndarray]:
        """Room for `needed` rows. `defaults`: the caller writes only some columns of its rows and relies
        on the others holding their defaults; without it (appended parts write every column) the memory
        is not filled first, which saves a pass over it (1.2 GB for a 2 GB trace)."""
        if self.columns is None:
            self.columns = _allocate(max(needed, self._estimate(needed, consumed_bytes)), defaults)
            self.prefilled = defaults
        elif needed > len(self.columns["ts_us"]):
            capacity = len(self.columns["ts_us"])
            _grow(self.columns, max(needed, self._estimate(needed, consumed_bytes), capacity + capacity // 4), self.prefilled)
        if defaults and not self.prefilled:
            _set_defaults(self.columns, self.filled)
            self.prefilled = True
        return self.columns

    def parts(self) -> tuple[dict[str, Any], list[Any], int]:
        """The filled columns, the interned values in id order and the dropped count, to `append`
        elsewhere (the interner gives ids in insertion order)."""
        columns = self._trimmed()
        return columns, list(self.interner), self.dropped

    def _trimmed(self) -> dict[str, Any]:
        """The columns cut to the filled rows, in place (frees the unused tail), and the sparse ones."""
        columns = self.columns if self.columns is not None else _allocate(0)
        if self.filled < len(columns["ts_us"]):
            for values in columns.values():
                values.resize(self.filled, refcheck=False)
        return {**columns, **self.sparse.columns(self.filled)}

    def _estimate(self, events: int, consumed_bytes: int) -> int:
        if not self.size_hint or not consumed_bytes:
            return events
        return int(events / consumed_bytes * self.size_hint * 1.02) + 64

    def finish(self, warnings: list[str]) -> tuple[EventTable, int]:
        columns = self._trimmed()
        if self.dropped:
            warnings.append(f"dropped {self.dropped} malformed event(s) of {self.filled + self.dropped}")
        return EventTable(columns, canonical_strings(columns, self.interner)), self.dropped


_KEY_TYPE_RANK = {str: 0, int: 1, bytes: 2}


def canonical_strings(columns: dict[str, Any], interner: StringInterner) -> list[str]:
    """Renumber the string columns in place so that ids follow the sorted text, keeping only strings
    some event refers to; return the new string table (id 0 stays the empty string).

    Why: ids otherwise follow the order strings were first met, which depends on how the text was
    decoded (the compiled scanner interns event by event, the msgspec path column by column, byte ranges
    part by part). Analyses that break ties by id would then order equal rows differently depending on
    the path; canonical ids make the tables, and so the reports, identical whichever path parsed them.
    Keys with the same text stay distinct (pid 1 and pid "1"), ordered by key type."""
    keys = list(interner)  # in id order: the interner assigns ids in insertion order
    strings = interner.strings
    used = np.zeros(len(strings), dtype=bool)
    used[0] = True
    nonempty: dict[str, np.ndarray | None] = {}  # per dense column: its rows with a string, or None: all
    for name in STRING_COLUMNS:
        column = columns[name]
        if isinstance(column, SparseColumn):
            used[column.values] = True
            used[column.default] |= column.rows.size < column.size
            continue
        nonempty[name] = _nonempty_rows(column)
        values = column if nonempty[name] is None else column[nonempty[name]]
        if values.size:
            used |= np.bincount(values, minlength=used.size) > 0  # a count: faster than a scatter

    def order_key(i: int) -> tuple[bool, str, int, bytes]:
        key = keys[i]
        raw = key if isinstance(key, bytes) else b""  # two byte strings can decode to the same text
        return (i != 0, strings[i], _KEY_TYPE_RANK.get(type(key), 3), raw)

    order = sorted(np.flatnonzero(used).tolist(), key=order_key)
    new_id = np.zeros(len(strings), dtype=np.int32)
    new_id[order] = np.arange(len(order), dtype=np.int32)
    for name in STRING_COLUMNS:
        column = columns[name]
        if isinstance(column, SparseColumn):
            np.take(new_id, column.values, out=column.values)
            column.default = column.dtype.type(new_id[column.default])
        elif (rows := nonempty[name]) is None:
            np.take(new_id, column, out=column)
        elif rows.size:  # id 0 stays 0
            column[rows] = new_id[column[rows]]
    return [strings[i] for i in order]


def _nonempty_rows(column: np.ndarray) -> np.ndarray | None:
    """The rows of a string column that hold a non-empty string, when they are under a quarter of it
    (stacks, shapes, grids, labels: only some kinds carry them); None for a mostly non-empty column,
    which is cheaper to process whole."""
    count = np.count_nonzero(column)
    return np.flatnonzero(column) if count < column.size // 4 else None


_DEFAULTS: dict[str, Any] = {
    **{name: -1 for name in NUMERIC_COLUMNS},
    **{name: default for name, (_, _, default) in schema.ARG_FIELDS.items() if name in NUMERIC_COLUMNS},
    **{name: 0 for name in STRING_COLUMNS},
    "kind": 0,
}
# Column -> the event kinds it is read from (columns of every kind are absent here).
_COLUMN_KINDS: dict[str, tuple[Kind, ...]] = {"flow_id": (Kind.FLOW,)}
for _group in schema.ARG_GROUPS:
    for _column in _group.columns:
        _COLUMN_KINDS[_column] = (*_COLUMN_KINDS.get(_column, ()), *_group.kinds)
_ALL_DTYPES: dict[str, Any] = {**NUMERIC_COLUMNS, **{name: np.int32 for name in STRING_COLUMNS}, "kind": np.int8}
_DTYPES: dict[str, Any] = {name: dtype for name, dtype in _ALL_DTYPES.items() if name not in SPARSE_COLUMNS}  # dense ones


class _SparseParts:
    """The sparse columns as they are filled: per column, the rows (in order) that hold a value other
    than an absent one, and those values. Absent: the column's table default, and for string columns
    also the id of the declared default's key (`b""` for a raw-text arg), which reads as the same text."""

    def __init__(self, interner: StringInterner) -> None:
        self.rows: dict[str, list[np.ndarray]] = {name: [] for name in SPARSE_COLUMNS}
        self.values: dict[str, list[np.ndarray]] = {name: [] for name in SPARSE_COLUMNS}
        self.absent: dict[str, tuple[int, ...]] = {}
        for name in SPARSE_COLUMNS:
            _, kind, default = schema.ARG_FIELDS[name]
            if name in STRING_COLUMNS:
                key = bytes(default) if kind is msgspec.Raw else default
                self.absent[name] = tuple(sorted({_DEFAULTS[name], interner[key]}))
            else:
                assert np.issubdtype(_ALL_DTYPES[name], np.integer), "a float default (NaN) never compares equal"
                self.absent[name] = (_DEFAULTS[name],)

    def add_batch(self, name: str, values: np.ndarray, carrying: np.ndarray | None, offset: int) -> None:
        """A scanned batch's values of every event (`carrying`: the events of the column's kinds)."""
        if carrying is None:
            return
        keep = carrying.copy()
        for absent in self.absent[name]:
            keep &= values != absent
        index = np.flatnonzero(keep)
        if index.size:
            self.add(name, index + offset, values[index], filtered=True)

    def add(self, name: str, rows: np.ndarray, values: np.ndarray, filtered: bool = False) -> None:
        """Values at rows (after every row already added); `filtered`: none of them is absent."""
        if not filtered:
            keep = np.ones(values.size, dtype=bool)
            for absent in self.absent[name]:
                keep &= values != absent
            rows, values = rows[keep], values[keep]
        if rows.size:
            self.rows[name].append(rows.astype(np.int64, copy=False))
            self.values[name].append(values.astype(_ALL_DTYPES[name], copy=False))

    def columns(self, size: int) -> dict[str, SparseColumn]:
        out: dict[str, SparseColumn] = {}
        for name in sorted(SPARSE_COLUMNS):
            dtype = _ALL_DTYPES[name]
            rows = np.concatenate(self.rows[name]) if self.rows[name] else np.zeros(0, np.int64)
            values = np.concatenate(self.values[name]) if self.values[name] else np.zeros(0, dtype)
            if rows.size > 1 and not (rows[1:] > rows[:-1]).all():  # a column read for two arg groups
                order = np.argsort(rows, kind="stable")
                rows, values = rows[order], values[order]
                last = np.append(rows[1:] != rows[:-1], True)  # the later write wins, as in a dense column
                rows, values = rows[last], values[last]
            out[name] = SparseColumn(size, rows, values, _DEFAULTS[name])
        share_rows(out.values())
        return out


def _allocate(n: int, defaults: bool = True) -> dict[str, np.ndarray]:
    """Columns for n rows, holding each column's "absent" default (or left unset)."""
    if not defaults:
        return {name: np.empty(n, dtype) for name, dtype in _DTYPES.items()}
    return {name: np.full(n, _DEFAULTS[name], dtype) for name, dtype in _DTYPES.items()}


def _grow(columns: dict[str, np.ndarray], capacity: int, defaults: bool = True) -> None:
    old = len(columns["ts_us"])
    for values in columns.values():
        values.resize(capacity, refcheck=False)  # realloc in place; only column views are transient
    if defaults:
        _set_defaults(columns, old)


def _set_defaults(columns: dict[str, np.ndarray], start: int) -> None:
    for name, values in columns.items():
        values[start:] = _DEFAULTS[name]


class _KindCache:
    """Kinds of a batch by table lookups over string ids, never a pass over the string table.

    An event's kind comes from its `ph` (with whether its name is "[memory]", `kinds.kind_of_phase`) or
    else from its `cat` (`kinds.kind_of_category`), so two small tables indexed by string id are enough: the kind each phase
    decides (-1: the category decides), and the kind of each category. An entry is computed the first
    time its id shows up in that role (-2: not yet)."""

    def __init__(self, interner: StringInterner) -> None:
        self.interner = interner
        self.by_phase = np.zeros(0, np.int8)  # index 2 * phase id + memory name
        self.by_category = np.zeros(0, np.int8)

    def kinds(self, cat: np.ndarray, ph: np.ndarray, name: np.ndarray) -> np.ndarray:
        memory_name = name == self.interner["[memory]"]  # first: it may add a string
        size = len(self.interner.strings)
        if self.by_category.size < size:  # new strings since the last batch: room for their entries
            grown = max(size, 2 * self.by_category.size)
            self.by_phase = _extended(self.by_phase, 2 * grown)
            self.by_category = _extended(self.by_category, grown)
        phase_slot = 2 * ph.astype(np.intp) + memory_name
        decided = self._lookup(self.by_phase, phase_slot, self._phase_kind)
        by_category = self._lookup(self.by_category, cat, self._category_kind)
        return np.where(decided >= 0, decided, by_category).astype(np.int8, copy=False)

    @staticmethod
    def _lookup(table: np.ndarray, index: np.ndarray, compute: Callable[[int], int]) -> np.ndarray:
        values = table[index]
        unknown = values == -2
        if unknown.any():
            for i in distinct(index[unknown]).tolist():
                table[i] = compute(i)
            values = table[index]
        return values

    def _phase_kind(self, slot: int) -> int:
        kind = kind_of_phase(self.interner.strings[slot >> 1], bool(slot & 1))
        return -1 if kind is None else int(kind)

    def _category_kind(self, cat: int) -> int:
        return int(kind_of_category(self.interner.strings[cat]))


def _extended(table: np.ndarray, size: int) -> np.ndarray:
    grown = np.full(size, -2, np.int8)
    grown[: table.size] = table
    return grown


def _fill_columns(
    events: list[schema.Event], interner: StringInterner, kind_cache: _KindCache,
    columns: dict[str, np.ndarray], sparse: _SparseParts, offset: int,
) -> None:
    """Write one batch of decoded events into rows [offset, offset + len(events)) of the columns."""
    n = len(events)
    rows = slice(offset, offset + n)
    lookup: Callable[[Any], int] = interner.__getitem__
    columns["ts_us"][rows] = np.fromiter(map(attrgetter("ts"), events), np.float64, n)
    columns["dur_us"][rows] = np.fromiter(map(attrgetter("dur"), events), np.float64, n)
    for column in _BASE_STRING_SOURCES:
        columns[column][rows] = np.fromiter(map(lookup, map(attrgetter(column), events)), np.int32, n)
    kind = kind_cache.kinds(columns["cat"][rows], columns["ph"][rows], columns["name"][rows])
    columns["kind"][rows] = kind
    flows = np.flatnonzero(kind == Kind.FLOW)  # only flow events carry an `id`
    if flows.size:
        ids = list(map(attrgetter("id"), itemgetter_list(events, flows)))
        flow_ids = None
        if set(map(type, ids)) == {int}:  # Kineto's integer ids: converted at C speed
            try:
                flow_ids = np.fromiter(ids, np.int64, flows.size)
            except OverflowError:
                pass
        if flow_ids is None:  # strings, nulls, huge values: one by one
            flow_ids = np.fromiter(map(_flow_id, ids), np.int64, flows.size)
        columns["flow_id"][offset + flows] = flow_ids
    external_lower = np.full(n, -1, np.int64)
    for group in schema.ARG_GROUPS:
        index = np.flatnonzero(kind_mask(kind, group.kinds))
        if index.size == 0:
            continue
        args = list(map(attrgetter("args"), itemgetter_list(events, index)))
        target = offset + index
        for column in group.columns:
            values: Iterable[Any] = map(attrgetter(column), args)
            if column == "external_id_lower":
                external_lower[index] = np.fromiter(values, np.int64, index.size)
            elif column in SPARSE_COLUMNS:
                sparse.add(column, target, _values_array(column, values, lookup, index.size))
            elif column in _RAW_TEXT_COLUMNS:
                columns[column][target] = np.fromiter(map(lookup, map(bytes, values)), np.int32, index.size)
            elif column in NUMERIC_COLUMNS:
                columns[column][target] = np.fromiter(values, NUMERIC_COLUMNS[column], index.size)
            else:
                columns[column][target] = np.fromiter(map(lookup, values), np.int32, index.size)
    np.maximum(columns["external_id"][rows], external_lower, out=columns["external_id"][rows])


def _values_array(column: str, values: Iterable[Any], lookup: Callable[[Any], int], n: int) -> np.ndarray:
    if column in _RAW_TEXT_COLUMNS:
        return np.fromiter(map(lookup, map(bytes, values)), np.int32, n)
    if column in NUMERIC_COLUMNS:
        return np.fromiter(values, NUMERIC_COLUMNS[column], n)
    return np.fromiter(map(lookup, values), np.int32, n)


def itemgetter_list(items: list[Any], index: np.ndarray) -> list[Any]:
    """`[items[i] for i in index]` at C speed."""
    if index.size == 1:
        return [items[int(index[0])]]
    return list(itemgetter(*index.tolist())(items))


def _flow_id(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else -1
    try:
        number = int(str(value), 0)
    except ValueError:  # a non-numeric id: a stable 63-bit digest (str hashes change between processes)
        import hashlib  # here: it maps OpenSSL (~4 MB), and Kineto's flow ids are numbers

        digest = hashlib.blake2b(str(value).encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0x7FFFFFFFFFFFFFFF
    return number if -(2**63) <= number < 2**63 else -1
