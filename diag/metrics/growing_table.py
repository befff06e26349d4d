"""A table that grows at its end, step after step (`GrowingTable`, for the incremental analysis of
diag/metrics/live.py): its columns are numpy arrays with room to spare, doubled when full, so that
appending a step's rows costs those rows and reading the table (or its rows from a step on) as a
DataFrame copies nothing, however many steps it holds.

Rows are appended in step order (the `step` column never decreases), so the rows from a step on
are found by a binary search. Label columns (pandas categoricals) are kept as codes into their
labels, sorted as `astype("category")` sorts them, so the frame read back has the categories the
loader's tables have; string columns as codes too (read back by one `take` of their few labels,
not by converting a million Python strings at every read).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MIN_CAPACITY = 1024
"""Rows a column holds before its first doubling."""


class GrowingTable:
    """Rows appended in step order, read back as a DataFrame without a copy."""

    def __init__(self) -> None:
        self._columns: dict[str, np.ndarray] = {}
        self._labels: dict[str, list[Any]] = {}  # a label column's categories, sorted
        self._strings: dict[str, Any] = {}  # the string columns' dtypes (kept as labels too)
        self._start = 0  # rows before this were dropped (`drop_before`)
        self._end = 0
        self._names: list[str] = []

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, frame: pd.DataFrame) -> None:
        """Add the rows of `frame`, whose steps are none below the table's last."""
        if frame.empty:
            return
        if not self._names:
            self._names = list(frame.columns)
        assert list(frame.columns) == self._names, "a growing table's columns do not change"
        rows = len(frame)
        self._make_room(rows)
        for name in self._names:
            values = self._values(name, frame[name])
            column = self._columns.get(name)
            if column is None:
                column = np.empty(self._capacity(rows), dtype=values.dtype)
                self._columns[name] = column
            elif not np.can_cast(values.dtype, column.dtype, "same_kind"):
                column = column.astype(object)  # a column that changed type holds objects
                self._columns[name] = column
            column[self._end : self._end + rows] = values
        self._end += rows

    def frame(self, first_step: int = 0) -> pd.DataFrame:
        """The rows of steps `first_step` on, as a DataFrame over the kept arrays (a view:
        the rows later appended do not show in it, and it must not be written to)."""
        if not self._names:
            return pd.DataFrame()
        first = self._start
        if first_step > 0 and "step" in self._columns:
            steps = self._columns["step"][self._start : self._end]
            first += int(np.searchsorted(steps, first_step, side="left"))
        columns: dict[str, Any] = {}
        for name in self._names:
            values = self._columns[name][first : self._end]
            if name in self._strings:
                labels = pd.array(self._labels[name], dtype=self._strings[name])
                columns[name] = labels.take(values, allow_fill=True)
            elif name in self._labels:
                columns[name] = _categorical(values, self._labels[name])
            else:
                columns[name] = values
        return pd.DataFrame(columns, copy=False)

    def drop_before(self, step: int) -> None:
        """Forget the rows of steps below `step` (their memory is given back when they are
        at least half the table)."""
        if "step" not in self._columns:
            return
        steps = self._columns["step"][self._start : self._end]
        self._start += int(np.searchsorted(steps, step, side="left"))
        if self._start and self._start * 2 >= self._end:
            kept = self._end - self._start
            for name, column in self._columns.items():
                fresh = np.empty(self._capacity(kept), dtype=column.dtype)
                fresh[:kept] = column[self._start : self._end]
                self._columns[name] = fresh
            self._start, self._end = 0, kept

    def keep_before(self, step: int) -> None:
        """Forget the rows of steps `step` on."""
        if "step" in self._columns:
            steps = self._columns["step"][self._start : self._end]
            self._end = self._start + int(np.searchsorted(steps, step, side="left"))

    def _capacity(self, rows: int) -> int:
        return max(MIN_CAPACITY, 2 * (self._end + rows))

    def _make_room(self, rows: int) -> None:
        """Every column with room for `rows` more rows (doubled when short)."""
        for name, column in self._columns.items():
            if self._end + rows > len(column):
                grown = np.empty(self._capacity(rows), dtype=column.dtype)
                grown[: self._end] = column[: self._end]
                self._columns[name] = grown

    def _values(self, name: str, column: pd.Series) -> np.ndarray:
        """A column's values as stored: a label column's codes into the table's labels (the
        labels re-sorted, and the codes kept so far renumbered, when a new label comes)."""
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes, categories = column.cat.codes.to_numpy(), list(column.cat.categories)
        elif isinstance(column.dtype, pd.StringDtype) or name in self._labels:
            if name not in self._labels:  # read back as strings (`_strings`)
                self._strings[name] = column.dtype
            found, uniques = pd.factorize(column)  # (a chunk of nulls only: object, no labels)
            codes, categories = found, list(uniques)
        else:
            return column.to_numpy()
        known = self._labels.setdefault(name, [])
        new = [label for label in categories if label not in set(known)]
        if new:
            merged = _sorted_labels([*known, *new])
            if known and name in self._columns:
                renumber = np.array([merged.index(label) for label in known], dtype=np.int64)
                stored = self._columns[name].copy()  # frames read before keep the old codes
                kept = stored[self._start : self._end]
                kept[kept >= 0] = renumber[kept[kept >= 0]]
                self._columns[name] = stored
            known[:] = merged
        position = {label: code for code, label in enumerate(known)}
        lookup = np.array([position[label] for label in categories], dtype=np.int64)
        codes = codes.astype(np.int64)
        return np.where(codes >= 0, lookup[np.maximum(codes, 0)] if len(lookup) else -1, -1)


def _sorted_labels(labels: list[Any]) -> list[Any]:
    """Labels in the order pandas gives a categorical's categories."""
    return list(pd.Series(labels).astype("category").cat.categories)


def _categorical(codes: np.ndarray, labels: list[Any]) -> pd.Categorical:
    """Codes into sorted labels as the loader's categorical: only the labels used."""
    used = np.bincount(codes[codes >= 0], minlength=len(labels)) > 0
    if used.all():
        return pd.Categorical.from_codes(codes, categories=labels)
    renumber = np.cumsum(used) - 1
    kept = [label for label, keep in zip(labels, used.tolist(), strict=True) if keep]
    return pd.Categorical.from_codes(np.where(codes >= 0, renumber[codes], -1), categories=kept)
