"""`SparseColumn`: a table column that only a few events carry, stored as (rows, values).

Why: some declared args are on a handful of events (the collectives' `Collective name`, `Seq`, ...: a
few per step; `Concrete Inputs`: some ops), yet a dense column costs its width on every event (8 such
columns were 44 bytes an event, 76 MB on a 1.8 M-event trace). A sparse column keeps only the rows whose
value is not the column's default, sorted, and reads like a 1-d array where analyses use it:
`column[rows]` (integer or boolean index, slice, scalar) gives a dense numpy array or scalar, numpy
ufuncs and operators (`column >= 0`) and `np.asarray(column)` see the dense column.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin


class SparseColumn(NDArrayOperatorsMixin):
    """A column of `size` rows: `values[i]` at row `rows[i]` (strictly increasing), `default` elsewhere."""

    __slots__ = ("size", "rows", "values", "default")

    def __init__(self, size: int, rows: np.ndarray, values: np.ndarray, default: Any) -> None:
        self.size = int(size)
        self.rows = np.asarray(rows, dtype=np.int64)
        self.values = np.asarray(values)
        self.default = self.values.dtype.type(default)

    @classmethod
    def from_dense(cls, dense: np.ndarray, default: Any) -> "SparseColumn":
        rows = np.flatnonzero(dense != default)
        return cls(dense.size, rows, dense[rows], default)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.values.nbytes)

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"SparseColumn(size={self.size}, carried={self.rows.size}, dtype={self.dtype}, default={self.default!r})"

    def dense(self) -> np.ndarray:
        out = np.full(self.size, self.default, self.dtype)
        out[self.rows] = self.values
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.dense()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        dense = tuple(x.dense() if isinstance(x, SparseColumn) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(x.dense() if isinstance(x, SparseColumn) else x for x in kwargs["out"])
        return getattr(ufunc, method)(*dense, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Other array methods and attributes (`max()`, `sum()`, `nbytes` aside) act on the dense column,
        for code written against plain arrays (e.g. a plug-in analysis)."""
        if name.startswith("__") or name in SparseColumn.__slots__:
            raise AttributeError(name)
        return getattr(self.dense(), name)

    def tolist(self) -> list[Any]:
        return self.dense().tolist()

    def tobytes(self) -> bytes:
        return self.dense().tobytes()

    def astype(self, dtype: Any, copy: bool = True) -> np.ndarray:
        return self.dense().astype(dtype)

    def take(self, indices: Any) -> np.ndarray:
        return self[np.asarray(indices)]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, (int, np.integer)):
            row = int(index) + self.size if index < 0 else int(index)
            if not 0 <= row < self.size:
                raise IndexError(f"index {int(index)} is out of bounds for size {self.size}")
            found = int(np.searchsorted(self.rows, row))
            return self.values[found] if found < self.rows.size and self.rows[found] == row else self.default
        if isinstance(index, slice):
            start, stop, step = index.indices(self.size)
            if step != 1:
                return self[np.arange(start, stop, step)]
            stop = max(stop, start)
            lo, hi = np.searchsorted(self.rows, [start, stop])
            out = np.full(stop - start, self.default, self.dtype)
            out[self.rows[lo:hi] - start] = self.values[lo:hi]
            return out
        index = np.asarray(index)
        if index.dtype == bool:
            if index.shape != (self.size,):
                raise IndexError(f"boolean index of shape {index.shape} for a column of {self.size} rows")
            index = np.flatnonzero(index)
        if not np.issubdtype(index.dtype, np.integer):
            raise IndexError("only integers, slices and integer or boolean arrays are valid indices")
        if index.size * 4 * max(int(self.rows.size).bit_length(), 1) > self.size:
            # Many rows asked for: a binary search each (random access into `rows`) costs more than
            # expanding the column once (a sequential pass) and indexing that.
            return self.dense()[index]
        wanted = np.where(index < 0, index + self.size, index)
        if wanted.size and (wanted.min() < 0 or wanted.max() >= self.size):
            raise IndexError(f"index out of bounds for size {self.size}")
        out = np.full(index.shape, self.default, self.dtype)
        if self.rows.size:
            found = np.searchsorted(self.rows, wanted)
            np.minimum(found, self.rows.size - 1, out=found)
            hit = self.rows[found] == wanted
            out[hit] = self.values[found[hit]]
        return out

    def select(self, keep: np.ndarray) -> "SparseColumn":
        """The column of the rows where the boolean `keep` holds, still sparse."""
        new_row = np.cumsum(keep) - 1
        kept = keep[self.rows]
        return SparseColumn(int(np.count_nonzero(keep)), new_row[self.rows[kept]], self.values[kept], self.default)

    def __eq__(self, other: Any) -> Any:  # elementwise, as for arrays (the mixin's would do the same)
        return np.equal(self, other)

    def __ne__(self, other: Any) -> Any:
        return np.not_equal(self, other)

    __hash__ = None  # type: ignore[assignment]


def dense_of(column: Any) -> np.ndarray:
    """A column as a numpy array (a sparse one expanded)."""
    return column.dense() if isinstance(column, SparseColumn) else column


def select_rows(column: Any, keep: np.ndarray) -> Any:
    """`column[keep]` for a boolean `keep`, keeping a sparse column sparse."""
    return column.select(keep) if isinstance(column, SparseColumn) else column[keep]


def share_rows(columns: Iterable[SparseColumn]) -> None:
    """Let columns that carry values on the same rows (the args of one kind of event) hold one row array."""
    kept: list[np.ndarray] = []
    for column in columns:
        for rows in kept:
            if rows.size == column.rows.size and np.array_equal(rows, column.rows):
                column.rows = rows
                break
        else:
            kept.append(column.rows)
