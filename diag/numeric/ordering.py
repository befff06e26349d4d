"""Orderings and per-group statistics of millions of records with numpy, without pandas'
group-by machinery (which factorizes every key again on each call).

Every ordering here is stable, so ties keep the order of the input: the results equal those of
`DataFrame.sort_values(..., kind="stable")` and of a pandas group-by over the same keys.
"""

from __future__ import annotations

import numpy as np

_INT64_MAX = np.iinfo(np.int64).max


def lexicographic(*keys: np.ndarray) -> np.ndarray:
    """The stable order of rows by `keys[0]`, then `keys[1]`, ... (integers, such as ranks,
    steps and ns): `np.lexsort` of the keys reversed, but as one sort of a combined integer
    where the keys' ranges multiplied fit in int64 (several times faster)."""
    columns = [np.asarray(key, dtype=np.int64) for key in keys]
    combined = combined_key(columns)
    return np.lexsort(columns[::-1]) if combined is None else np.argsort(combined, kind="stable")


def grouped_order(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """An order of rows by `key`, then `value` (integers), equal rows in no particular order:
    for statistics of the values, which do not depend on which of two equal rows comes first
    (an unstable sort of the combined integer is some four times faster than a stable one)."""
    columns = [np.asarray(key, dtype=np.int64), np.asarray(value, dtype=np.int64)]
    combined = combined_key(columns)
    return np.lexsort(columns[::-1]) if combined is None else np.argsort(combined)


def combined_key(columns: list[np.ndarray]) -> np.ndarray | None:
    """One integer per row that orders the rows as the columns do, one after the other (a
    mixed-radix number of the columns' offsets); None where it would overflow int64."""
    combined, space = np.zeros(len(columns[0]), dtype=np.int64), 1
    if len(combined) == 0:
        return combined
    for column in columns:
        low = int(column.min())
        width = int(column.max()) - low + 1
        if space > _INT64_MAX // width:
            return None
        combined, space = combined * width + (column - low), space * width
    return combined


def half_units(values: np.ndarray) -> np.ndarray | None:
    """`values` doubled, as int64, where that is exact: every value finite, a multiple of 1/2
    (ns and medians of ns), under 2**52 in magnitude, and no -0.0 (which equals 0.0 but has
    other bits); None otherwise. They sort as the values do, and `k / 2` gives each back."""
    doubled = np.asarray(values, dtype=np.float64) * 2
    if len(doubled) == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.isfinite(doubled).all() or np.abs(doubled).max() >= 2.0**53:
        return None
    units = doubled.astype(np.int64)
    if (units != doubled).any() or np.signbit(doubled[units == 0]).any():
        return None
    return units


def by_key_then_value(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The stable order of rows by `key`, then `value` (integers)."""
    return lexicographic(key, value)


def dense_key(*keys: np.ndarray) -> np.ndarray:
    """One integer per row that is equal where all `keys` (integers, such as ranks, steps,
    flags) are, for grouping: their mixed-radix combination, or where that would overflow
    int64 (hostile ranges), the index of each row's distinct combination."""
    columns = [np.asarray(key, dtype=np.int64) for key in keys]
    combined = combined_key(columns)
    if combined is not None:
        return combined
    return np.unique(np.column_stack(columns), axis=0, return_inverse=True)[1].reshape(-1)


def run_starts(keys: np.ndarray) -> np.ndarray:
    """Where each run of equal consecutive `keys` starts (the rows of a key together, such as a
    rank's in rows sorted by rank): the offsets for `np.*.reduceat`."""
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))


def occurrence(key: np.ndarray, time: np.ndarray | None = None) -> np.ndarray:
    """Per row, how many rows of the same `key` come before it in `time` (ties, or no `time`:
    in row order): pandas' `cumcount` by `key` after a stable sort by `time` (integers)."""
    key = np.asarray(key, dtype=np.int64)
    order = np.argsort(key, kind="stable") if time is None else by_key_then_value(key, time)
    starts = run_starts(key[order])
    sizes = np.diff(np.append(starts, len(key)))
    out = np.empty(len(key), dtype=np.int64)
    out[order] = np.arange(len(key)) - np.repeat(starts, sizes)
    return out


def group_medians(
    key: np.ndarray, value: np.ndarray, divisor: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (ascending) and the median of each one's `value / divisor` (integer
    values, such as ns, with a divisor to seconds; or floats without NaN, with divisor 1), as
    a pandas group-by median of the divided values: the middle one, or the mean of the two
    middle ones. Only the values matter, not which row holds them: for integers, one plain
    sort of a combined integer where it fits in int64."""
    key, value = np.asarray(key, dtype=np.int64), np.asarray(value)
    if value.dtype.kind != "f":
        value = value.astype(np.int64)
    combined = combined_key([key, value]) if value.dtype.kind == "i" else None
    if combined is None:
        order = np.lexsort((value, key))
        key, value = key[order], value[order]
    else:
        value_lo, width = int(value.min()), int(value.max()) - int(value.min()) + 1
        combined, key_lo = np.sort(combined), int(key.min())
        key, value = combined // width + key_lo, combined % width + value_lo
    starts = run_starts(key)
    sizes = np.diff(np.append(starts, len(key)))
    low, high = value[starts + (sizes - 1) // 2], value[starts + sizes // 2]
    return key[starts], (low / divisor + high / divisor) / 2
