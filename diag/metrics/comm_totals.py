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

from diag.numeric.compiled import compiled, for_size, is_loaded
from diag.rankfile.records import Encoded
from diag.read.load import RunData

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
    `_SUMMED` columns as arrays (bytes: NaN where unknown; the loaders null infinities).
    Vectorised: the codes make one integer per record that orders as the keys do
    (`_record_keys`), and one pass sums over it (`_summed_by_key`: float sums of integers,
    exact below 2**53: 104 days of ns, 9 PB of bytes, per key)."""
    record_key, space, key_columns = _record_keys(keys)
    # compiled where it is loaded (a large run's workers) or for a large input; else numpy,
    # the same sums, without importing numba (a trace folder's reduction: issue 43)
    summed = for_size(_summed_by_key, len(record_key)) if is_loaded(_summed_by_key) else (
        _summed_in_numpy
    )  # fmt: skip
    present, count, bytes_, measured, expected_bytes, expected, duration_ns = summed(
        np.ascontiguousarray(record_key, dtype=np.int64), space,
        *(np.ascontiguousarray(numbers[name], dtype) for name, dtype in _SUMMED.items()),
    )  # fmt: skip
    frame: dict[str, Any] = {
        name: key.values(column)
        for name, key, column in zip(TOTAL_KEYS, keys, key_columns(present), strict=True)
    }
    frame |= {
        "count": count, "bytes": bytes_, "measured": measured,
        "expected_bytes": expected_bytes, "expected": expected,
        "duration_ns": duration_ns.astype(np.int64),
    }  # fmt: skip
    return {name: frame[name] for name in TOTAL_COLUMNS}


def _record_keys(
    keys: list[Codes],
) -> tuple[np.ndarray, int, Callable[[np.ndarray], list[np.ndarray]]]:
    """One integer per record in 0..space-1 that is equal where the key codes are and orders
    as they do, the space, and the way from such integers back to one code array per key:
    the codes as a mixed-radix number where the key space is not much larger than the
    records; else the index of each record's number among the distinct ones (a sort); where
    the key space overflows int64 (hostile ranges of ranks and steps), of its distinct rows."""
    space = math.prod(key.size for key in keys)
    if space >= 2**62:
        rows, inverse = np.unique(
            np.column_stack([key.codes for key in keys]), axis=0, return_inverse=True
        )
        return inverse.reshape(-1), len(rows), lambda present: list(rows[present].T)
    combined = np.zeros(len(keys[0].codes), dtype=np.int64)
    for key in keys:
        if key.size > 1:  # a key of one value (one file's rank) adds no digit
            combined *= key.size
            combined += key.codes

    def digits(numbers: np.ndarray) -> list[np.ndarray]:
        columns = []
        for key in reversed(keys):
            numbers, digit = np.divmod(numbers, key.size)
            columns.append(digit)
        return columns[::-1]

    if space <= 4 * len(combined) + 1024:
        return combined, space, digits
    distinct, inverse = np.unique(combined, return_inverse=True)
    return inverse, len(distinct), lambda present: digits(distinct[present])


def prepare_comm_totals() -> None:
    """Compile (or load from numba's cache) `totals_of`' loop now, as
    `intervals.prepare_union_lengths` does its own, before a process forks its workers."""
    empty, none = np.zeros(0, dtype=np.int64), np.zeros(0)
    compiled(_summed_by_key)(empty, 0, none, none, empty, empty)


def _summed_by_key(
    key: np.ndarray, space: int, bytes_: np.ndarray, expected_bytes: np.ndarray,
    t0: np.ndarray, t1: np.ndarray,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """`totals_of`' loop (plain Python that numba compiles unchanged): the keys present in
    0..space-1, ascending; then per present key, the calls; the bytes summed where known
    (not NaN) and how many calls knew them; the same of the expected bytes; the summed
    durations (float sums in record order, as a `bincount` of weights adds them)."""
    seen = np.zeros(space, dtype=np.bool_)
    for i in range(len(key)):
        seen[key[i]] = True
    present = np.nonzero(seen)[0].astype(np.int64)
    groups = len(present)
    slot = np.empty(space, dtype=np.int64)
    for g in range(groups):
        slot[present[g]] = g
    count = np.zeros(groups, dtype=np.int64)
    measured = np.zeros(groups, dtype=np.int64)
    expected = np.zeros(groups, dtype=np.int64)
    bytes_sum = np.zeros(groups)
    expected_sum = np.zeros(groups)
    duration = np.zeros(groups)
    for i in range(len(key)):
        g = slot[key[i]]
        count[g] += 1
        if bytes_[i] == bytes_[i]:
            bytes_sum[g] += bytes_[i]
            measured[g] += 1
        if expected_bytes[i] == expected_bytes[i]:
            expected_sum[g] += expected_bytes[i]
            expected[g] += 1
        duration[g] += t1[i] - t0[i]
    return present, count, bytes_sum, measured, expected_sum, expected, duration


def _summed_in_numpy(
    key: np.ndarray, space: int, bytes_: np.ndarray, expected_bytes: np.ndarray,
    t0: np.ndarray, t1: np.ndarray,
) -> tuple[np.ndarray, ...]:  # fmt: skip
    """`_summed_by_key` in numpy: the same keys and sums (`bincount` adds its weights in record
    order, as the loop does)."""
    seen = np.bincount(key, minlength=space) > 0
    present = np.flatnonzero(seen).astype(np.int64)
    slot = np.zeros(space, dtype=np.int64)
    slot[present] = np.arange(len(present))
    group = slot[key]
    groups = len(present)
    known, known_expected = bytes_ == bytes_, expected_bytes == expected_bytes
    return (
        present,
        np.bincount(group, minlength=groups).astype(np.int64),
        np.bincount(group[known], weights=bytes_[known], minlength=groups),
        np.bincount(group[known], minlength=groups).astype(np.int64),
        np.bincount(group[known_expected], weights=expected_bytes[known_expected],
                    minlength=groups),
        np.bincount(group[known_expected], minlength=groups).astype(np.int64),
        np.bincount(group, weights=(t1 - t0).astype(np.float64), minlength=groups),
    )  # fmt: skip


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
        small = _whole_number_codes(np.asarray(column)) if column.dtype.kind == "f" else None
        if small is not None:
            return small
        found, uniques = pd.factorize(column, sort=True, use_na_sentinel=True)
        table = np.append(np.asarray(uniques, dtype=np.float64), np.nan)  # null: the last code
        codes = np.where(found < 0, len(uniques), found).astype(np.int64)
        return cls(codes, len(uniques) + 1, lambda c: table[c])

    @classmethod
    def of_labels(cls, labels: list[str | None], codes: np.ndarray) -> Codes:
        """A dictionary-encoded column of labels (strings; None: null) as codes in sorted
        label order, null last, as `of` gives a categorical; back as labels dictionary-encoded
        (`Encoded`: the sorted labels, then None)."""
        ordered = sorted(label for label in labels if label is not None)
        position = {label: i for i, label in enumerate(ordered)}
        null = len(ordered)
        remap = np.array([null if label is None else position[label] for label in labels] or [0])
        return cls(np.take(remap, codes), len(ordered) + 1, lambda c: Encoded([*ordered, None], c))


def _whole_number_codes(values: np.ndarray) -> Codes | None:
    """`Codes.of` numbers that are few whole numbers or NaN (group sizes), as a sorted
    factorize gives them (codes of the distinct values in order, NaN last) by a count over
    their range instead of a hash; None for anything else, and for -0.0 (factorize keeps
    whichever zero it meets first, a count cannot tell)."""
    nulls = np.isnan(values)
    if nulls.all():
        return None
    low, high = float(np.fmin.reduce(values)), float(np.fmax.reduce(values))
    if not (-(2.0**52) < low <= high < 2.0**52) or high - low > len(values):
        return None
    offsets = np.where(nulls, 0.0, values - low)
    whole = offsets.astype(np.int64)
    if (whole != offsets).any() or (low <= 0 <= high and np.signbit(values[values == 0]).any()):
        return None
    width = int(high - low) + 1
    whole[nulls] = width
    present = np.bincount(whole, minlength=width + 1)[:width] > 0
    code_of_offset = np.append(np.cumsum(present) - 1, present.sum())  # null: the last code
    table = np.append(low + np.flatnonzero(present).astype(np.float64), np.nan)
    return Codes(code_of_offset[whole], len(table), lambda c: table[c])


def run_comm_totals(run: RunData) -> pd.DataFrame:
    """The run's collective totals: the loader's (a large run's workers summed them), else
    summed now from its records (`compute_metrics` does it once: `RunMetrics.comm_totals`)."""
    return comm_totals(run.comms) if run.comm_totals is None else run.comm_totals


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
