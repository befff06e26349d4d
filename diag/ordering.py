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
    if len(columns[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    combined, space = np.zeros(len(columns[0]), dtype=np.int64), 1
    for column in columns:
        low = int(column.min())
        width = int(column.max()) - low + 1
        if space > _INT64_MAX // width:  # the combined key would overflow: the many-key sort
            return np.lexsort(columns[::-1])
        combined, space = combined * width + (column - low), space * width
    return np.argsort(combined, kind="stable")


def by_key_then_value(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """The stable order of rows by `key`, then `value` (integers)."""
    return lexicographic(key, value)


def dense_key(*keys: np.ndarray) -> np.ndarray:
    """One integer per row that is equal where all `keys` (small integer ranges, such as
    ranks, steps, flags) are: a mixed-radix combination, for grouping."""
    combined = np.zeros(len(keys[0]), dtype=np.int64)
    for key in keys:
        key = np.asarray(key, dtype=np.int64)
        low = int(key.min()) if len(key) else 0
        combined = combined * (int(key.max()) - low + 1 if len(key) else 1) + (key - low)
    return combined


def occurrence(key: np.ndarray, time: np.ndarray | None = None) -> np.ndarray:
    """Per row, how many rows of the same `key` come before it in `time` (ties, or no `time`:
    in row order): pandas' `cumcount` by `key` after a stable sort by `time` (integers)."""
    key = np.asarray(key, dtype=np.int64)
    order = np.argsort(key, kind="stable") if time is None else by_key_then_value(key, time)
    ordered = key[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    sizes = np.diff(np.append(starts, len(key)))
    out = np.empty(len(key), dtype=np.int64)
    out[order] = np.arange(len(key)) - np.repeat(starts, sizes)
    return out


def group_medians(
    key: np.ndarray, value: np.ndarray, divisor: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct keys (ascending) and the median of each one's `value / divisor` (integer
    values, such as ns; a divisor to seconds), as a pandas group-by median of the divided
    values: the middle one, or the mean of the two middle ones. Only the values matter, not
    which row holds them: one plain sort of a combined integer where it fits in int64."""
    key, value = np.asarray(key, dtype=np.int64), np.asarray(value, dtype=np.int64)
    key_lo, value_lo = int(key.min()), int(value.min())
    width = int(value.max()) - value_lo + 1
    if width > _INT64_MAX // (int(key.max()) - key_lo + 1):
        order = np.lexsort((value, key))
        key, value = key[order], value[order]
    else:
        combined = np.sort((key - key_lo) * width + (value - value_lo))
        key, value = combined // width + key_lo, combined % width + value_lo
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    sizes = np.diff(np.append(starts, len(key)))
    low, high = value[starts + (sizes - 1) // 2], value[starts + sizes // 2]
    return key[starts], (low / divisor + high / divisor) / 2
