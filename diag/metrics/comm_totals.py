"""Collectives summed per (rank, step, op, group, tag, group size): what every metric and rule
that counts bytes, calls or time needs, at a size that does not grow with the number of calls.

A large run's loader workers sum their ranks' collectives into this table
(`diag.metrics.file_reduction`) and keep the records
themselves only for a window of steps (`RunData.span_steps`); a small run's is summed here from
every record. The sums are of integers (bytes, nanoseconds, counts), so they are exact in any
order: both ways give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from diag.load import RunData

TOTAL_KEYS = ["rank", "step", "op", "group", "tag", "group_size"]
TOTAL_COLUMNS = [
    *TOTAL_KEYS, "count", "bytes", "measured", "expected_bytes", "expected", "duration_ns",
]  # fmt: skip
"""count: calls; bytes: their summed payload (0 when none says); measured: calls that say
their bytes (profiler traces of gloo or DeepEP may not); expected_bytes and expected: the same
for the ledger's bytes; duration_ns: summed t1 - t0."""


def comm_totals(comms: pd.DataFrame) -> pd.DataFrame:
    """The collectives of `comms` summed per TOTAL_KEYS (a null key is a key of its own), one
    row per key in key order."""
    if comms.empty:
        return empty_totals()
    keys = [Codes.of(comms[key]) for key in TOTAL_KEYS]
    numbers = {name: comms[name].to_numpy(dtype) for name, dtype in _SUMMED.items()}
    return pd.DataFrame(totals_of(keys, numbers))


_SUMMED = {"bytes": np.float64, "expected_bytes": np.float64, "t0": np.int64, "t1": np.int64}
"""The collectives' columns summed (bytes, the ledger's bytes) or timed (t0, t1)."""


def empty_totals() -> pd.DataFrame:
    """The totals of no collectives."""
    return pd.DataFrame({name: pd.Series(dtype=_dtype(name)) for name in TOTAL_COLUMNS})


def totals_of(keys: list[Codes], numbers: dict[str, np.ndarray]) -> dict[str, Any]:
    """`comm_totals`' columns from the key columns as codes (TOTAL_KEYS' order) and the
    `_SUMMED` columns as arrays. Vectorised: the codes make one mixed-radix integer per
    record, and the sums are `bincount`s over it (float sums of integers, exact below
    2**53: 104 days of ns, 9 PB of bytes, per key)."""
    digits, inverse = _distinct_keys(keys)
    frame: dict[str, Any] = {
        name: key.values(digit) for name, key, digit in zip(TOTAL_KEYS, keys, digits, strict=True)
    }
    groups = len(frame["rank"])

    def summed(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values, minlength=groups)

    bytes_, expected = numbers["bytes"], numbers["expected_bytes"]
    frame["count"] = np.bincount(inverse, minlength=groups).astype(np.int64)
    frame["bytes"] = summed(np.nan_to_num(bytes_, nan=0.0))
    frame["measured"] = summed((~np.isnan(bytes_)).astype(np.float64)).astype(np.int64)
    frame["expected_bytes"] = summed(np.nan_to_num(expected, nan=0.0))
    frame["expected"] = summed((~np.isnan(expected)).astype(np.float64)).astype(np.int64)
    frame["duration_ns"] = summed((numbers["t1"] - numbers["t0"]).astype(float)).astype(np.int64)
    return {name: frame[name] for name in TOTAL_COLUMNS}


def _distinct_keys(keys: list[Codes]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct combinations of the key codes in key order (one code array per key) and
    each record's index among them: by one mixed-radix integer per record where the key
    space fits int64, else (hostile ranges of ranks and steps) by the distinct rows."""
    space = math.prod(key.size for key in keys)
    if space >= 2**62:
        rows, inverse = np.unique(
            np.column_stack([key.codes for key in keys]), axis=0, return_inverse=True
        )
        return list(rows.T), inverse.reshape(-1)
    combined = np.zeros(len(keys[0].codes), dtype=np.int64)
    for key in keys:
        combined = combined * key.size + key.codes
    present, inverse = _present_and_inverse(combined, space)
    digits = []
    for key in reversed(keys):
        present, digit = np.divmod(present, key.size)
        digits.append(digit)
    return digits[::-1], inverse


def _present_and_inverse(combined: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `combined` (sorted) and each element's index among them:
    by a count over the key space when it is not much larger than the records (no sort),
    else by `np.unique`."""
    if space > 4 * len(combined) + 1024:
        return np.unique(combined, return_inverse=True)
    present = np.flatnonzero(np.bincount(combined, minlength=space))
    position = np.zeros(space, dtype=np.int64)
    position[present] = np.arange(len(present))
    return present, position[combined]


@dataclass
class Codes:
    """One key column as integer codes 0..size-1 (null: a code of its own) and the way back."""

    codes: np.ndarray
    size: int
    values: Callable[[np.ndarray], Any]

    @classmethod
    def of(cls, column: pd.Series | np.ndarray) -> Codes:
        """Codes in the order of the values (as a sorted group-by gives them), null last:
        a categorical's labels, integers, or numbers (NaN: null)."""
        if isinstance(column.dtype, pd.CategoricalDtype):  # labels (sorted categories)
            assert isinstance(column, pd.Series)
            dtype, labels = column.dtype, len(column.dtype.categories)
            codes = column.cat.codes.to_numpy(np.int64)
            return cls(np.where(codes < 0, labels, codes), labels + 1,
                       lambda c: pd.Categorical.from_codes(np.where(c == labels, -1, c),
                                                           dtype=dtype))  # fmt: skip
        if column.dtype.kind in "iu":  # ranks and steps: dense integers
            values = np.asarray(column, dtype=np.int64)
            low = int(values.min())
            return cls(values - low, int(values.max()) - low + 1, lambda c: c + low)
        found, uniques = pd.factorize(column, sort=True, use_na_sentinel=True)
        table = np.append(np.asarray(uniques, dtype=np.float64), np.nan)  # null: the last code
        codes = np.where(found < 0, len(uniques), found).astype(np.int64)
        return cls(codes, len(uniques) + 1, lambda c: table[c])

    @classmethod
    def of_labels(cls, labels: list[str | None], codes: np.ndarray) -> Codes:
        """A dictionary-encoded column of labels (strings; None: null) as codes in sorted
        label order, null last, as `of` gives a categorical; back as an object array."""
        ordered = sorted(label for label in labels if label is not None)
        position = {label: i for i, label in enumerate(ordered)}
        null = len(ordered)
        remap = np.array([null if label is None else position[label] for label in labels] or [0])
        table = np.array([*ordered, None], dtype=object)
        return cls(remap[codes], len(ordered) + 1, lambda c: table[c])


def run_comm_totals(run: RunData) -> pd.DataFrame:
    """The run's collective totals: the loader's (a large run's workers summed them), else
    summed now from its records and kept on the run for the next caller."""
    if run.comm_totals is None:
        run.comm_totals = comm_totals(run.comms)
    return run.comm_totals


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The median of `values` each repeated `weights` times (nulls left out), as the median of
    the repeated values would be: the middle one, or the mean of the middle two."""
    known = ~np.isnan(values) & (weights > 0)
    values, weights = values[known], weights[known]
    total = int(weights.sum())
    if total == 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(weights[order])
    low = values[np.searchsorted(ends, (total - 1) // 2, side="right")]
    high = values[np.searchsorted(ends, total // 2, side="right")]
    return float((low + high) / 2)


def _dtype(name: str) -> str:
    if name in ("rank", "step", "count", "measured", "expected", "duration_ns"):
        return "int64"
    return "float64" if name in ("bytes", "expected_bytes", "group_size") else "object"
