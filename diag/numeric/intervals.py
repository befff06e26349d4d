"""Measure of unions of half-open time intervals [start, end), as pure numpy/pandas helpers.

Intervals are (start, end) pairs in any unit (records use integer ns; int64 keeps them exact).
Empty or reversed intervals (end <= start) have measure 0. The grouped variant measures one union
per group in one vectorised pass: sort by start, and let each interval contribute only the part
past the running maximum end of the intervals before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from diag.numeric.compiled import compiled, is_loaded
from diag.numeric.ordering import combined_key
from diag.numeric.window_unions import window_unions

NUMPY_UNIONS_UP_TO = 500_000
"""Below this many intervals a process that has not loaded the compiled loop measures in numpy
(~0.5 us an interval) rather than import numba and load the loop (~0.4 s; ~0.1 us an interval)."""


def _as_array(intervals: Iterable[Sequence[float]] | np.ndarray) -> np.ndarray:
    arr = np.asarray(list(intervals) if not isinstance(intervals, np.ndarray) else intervals)
    if arr.size == 0:
        return np.empty((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"intervals must be (start, end) pairs, got shape {arr.shape}")
    return arr[arr[:, 1] > arr[:, 0]]


def merge(intervals: Iterable[Sequence[float]] | np.ndarray) -> np.ndarray:
    """The union as sorted, disjoint (start, end) rows; touching intervals are joined."""
    arr = _as_array(intervals)
    if len(arr) == 0:
        return arr
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    ends_so_far = np.maximum.accumulate(arr[:, 1])
    new_run = np.ones(len(arr), dtype=bool)
    new_run[1:] = arr[1:, 0] > ends_so_far[:-1]
    starts = np.flatnonzero(new_run)
    return np.column_stack([arr[starts, 0], np.maximum.reduceat(arr[:, 1], starts)])


def union_length(intervals: Iterable[Sequence[float]] | np.ndarray) -> float:
    """Measure of the union of the intervals (overlaps counted once)."""
    merged = merge(intervals)
    return (merged[:, 1] - merged[:, 0]).sum().item() if len(merged) else 0


def subtract(
    a: Iterable[Sequence[float]] | np.ndarray, b: Iterable[Sequence[float]] | np.ndarray
) -> float:
    """Measure of union(a) minus union(b): |A \\ B| = |A u B| - |B|."""
    arr_a, arr_b = _as_array(a), _as_array(b)
    both = np.concatenate([arr_a, arr_b]) if len(arr_b) else arr_a
    return union_length(both) - union_length(arr_b)


def difference(
    a: Iterable[Sequence[float]] | np.ndarray, b: Iterable[Sequence[float]] | np.ndarray
) -> np.ndarray:
    """union(a) minus union(b), as sorted disjoint (start, end) rows."""
    kept, cuts = merge(a), merge(b)
    if len(kept) == 0 or len(cuts) == 0:
        return kept
    out: list[tuple[float, float]] = []
    j = 0
    rows = cuts.tolist()  # Python numbers: the loop reads no numpy scalars
    for start, end in kept.tolist():
        while j < len(rows) and rows[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(rows) and rows[k][0] < end:
            if rows[k][0] > cursor:
                out.append((cursor, rows[k][0]))
            cursor = max(cursor, rows[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return np.array(out, dtype=kept.dtype).reshape(-1, 2)


def covered_before(union: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per time, how much of `union` (sorted, disjoint intervals, as `merge` gives them) lies
    before it: the covered part of [a, b) is covered_before(b) - covered_before(a)."""
    if len(union) == 0:
        return np.zeros(len(times), dtype=np.int64)
    starts, ends = union[:, 0], union[:, 1]
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    k = np.searchsorted(starts, times, side="right")  # intervals starting at or before
    last = np.clip(k - 1, 0, None)
    return before[k] - np.where(k > 0, np.clip(ends[last] - times, 0, None), 0)


def clip(intervals: Iterable[Sequence[float]] | np.ndarray, lo: float, hi: float) -> np.ndarray:
    """The intervals cut to the window [lo, hi]; those left empty are dropped."""
    arr = _as_array(intervals)
    clipped = np.column_stack([np.maximum(arr[:, 0], lo), np.minimum(arr[:, 1], hi)])
    return clipped[clipped[:, 1] > clipped[:, 0]]


def union_length_by(
    frame: pd.DataFrame, keys: list[str], start: str = "t0", end: str = "t1"
) -> pd.Series:
    """Measure of the union of the [start, end) intervals of each group of `keys`.

    Returns a Series indexed by `keys` in sorted order (groups whose intervals are all empty
    measure 0; groups with no rows are absent). Integer keys and times (records: rank, step,
    ns) take a numpy path; anything else goes through pandas' groupby.
    """
    if frame.empty:
        index = pd.MultiIndex.from_tuples([], names=keys) if len(keys) > 1 else pd.Index([])
        return pd.Series([], index=index, dtype="int64")
    columns = [frame[name].to_numpy() for name in (*keys, start, end)]
    if all(c.dtype.kind in "iu" for c in columns):
        measured = _union_length_by_ints(columns[:-2], columns[-2], columns[-1], keys)
        if measured is not None:
            return measured
    return _union_length_by_frame(frame, keys, start, end)


def _union_length_by_ints(
    key_columns: list[np.ndarray], starts: np.ndarray, ends: np.ndarray, keys: list[str]
) -> pd.Series | None:
    """The grouped union in numpy: sort by (keys, start), then a running maximum of the ends
    that restarts at each group (each group's ends are offset into a band of their own);
    None when the bands would not fit in int64."""
    group_id = (
        None if len(key_columns) == 1 else combined_key([c.astype(np.int64) for c in key_columns])
    )
    sort_keys = key_columns[::-1] if group_id is None else [group_id]
    order = np.lexsort((starts, *sort_keys))  # one key column sorts several times faster
    s, e = starts[order].astype(np.int64), ends[order].astype(np.int64)
    first = np.zeros(len(s), dtype=bool)
    first[0] = True
    for column in sort_keys:
        ordered = column[order]
        first[1:] |= ordered[1:] != ordered[:-1]
    group = np.cumsum(first) - 1
    heads = np.flatnonzero(first)
    sorted_keys = [column[order[heads]] for column in key_columns]
    base = np.repeat(s[heads], np.diff(np.append(heads, len(s))))  # each group's first start
    relative_end = np.clip(e - base, 0, None)
    band = int(relative_end.max()) + 1
    if band * (int(group[-1]) + 1) >= 2**62:
        return None
    running = np.maximum.accumulate(relative_end + group * band) - group * band + base
    cover_from = s.copy()
    later = ~first
    cover_from[1:][later[1:]] = np.maximum(s[1:][later[1:]], running[:-1][later[1:]])
    gain = np.clip(e - cover_from, 0, None)
    totals = np.add.reduceat(gain, heads)
    index = (
        pd.MultiIndex.from_arrays(sorted_keys, names=keys)
        if len(keys) > 1
        else pd.Index(sorted_keys[0], name=keys[0])
    )
    return pd.Series(totals, index=index)


def _union_length_by_frame(frame: pd.DataFrame, keys: list[str], start: str, end: str) -> pd.Series:
    ordered = frame.sort_values([*keys, start], kind="stable")
    group_ids = ordered.groupby(keys, sort=False).ngroup().to_numpy()
    ends_so_far = ordered.groupby(keys, sort=False)[end].cummax().to_numpy()
    starts, ends = ordered[start].to_numpy(), ordered[end].to_numpy()
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = group_ids[1:] != group_ids[:-1]
    cover_from = starts.copy()
    cover_from[~first] = np.maximum(starts[~first], ends_so_far[:-1][~first[1:]])
    gain = np.clip(ends - cover_from, 0, None)
    gains = pd.Series(gain, index=ordered.index)
    return gains.groupby([ordered[k] for k in keys]).sum()


def overlapping(reference: pd.DataFrame, frame: pd.DataFrame, key: str = "rank") -> np.ndarray:
    """Which rows of `frame` overlap some interval of `reference` with the same `key` (a
    boolean array; all true if the times span too much to tell). Integer times: each key's
    intervals are shifted into a band of their own on one axis, merged, and every row is
    located with a binary search."""
    mask = np.zeros(len(frame), dtype=bool)
    if reference.empty or frame.empty:
        return mask
    lo = min(int(reference["t0"].min()), int(frame["t0"].min()))
    hi = max(int(reference["t1"].max()), int(frame["t1"].max()))
    band = hi - lo + 1
    top = max(int(reference[key].max()), int(frame[key].max())) + 1
    if band * top >= 2**62:  # the bands would not fit in int64: every row may overlap
        return np.ones(len(frame), dtype=bool)
    shift = reference[key].to_numpy(np.int64) * band - lo
    merged = merge(
        np.column_stack([reference["t0"].to_numpy(np.int64) + shift,
                         reference["t1"].to_numpy(np.int64) + shift])
    )  # fmt: skip
    if len(merged) == 0:
        return mask
    shift = frame[key].to_numpy(np.int64) * band - lo
    starts = frame["t0"].to_numpy(np.int64) + shift
    ends = frame["t1"].to_numpy(np.int64) + shift
    before = np.searchsorted(merged[:, 0], ends, side="left") - 1  # last one starting before
    found = before >= 0
    mask[found] = merged[before[found], 1] > starts[found]
    return mask & (ends > starts)


def union_lengths_in_windows(
    keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, measures: np.ndarray,
    window_keys: np.ndarray, window_starts: np.ndarray, window_ends: np.ndarray,
    measure_count: int,
) -> np.ndarray:  # fmt: skip
    """Several union measures per window in one pass: each [start, end) interval counts in
    the window whose key is its own (`window_keys`: ascending and distinct; none has it: in
    none), cut to that window ([window_starts[w], window_ends[w])); for each window and each
    bit k < measure_count, the measure of the union of its intervals whose `measures` has
    bit k set (an int64 array, windows x measure_count). Integer keys and times. Compiled
    for large inputs (diag/numeric/compiled.py) or where the compiled loop is loaded; in numpy
    below NUMPY_UNIONS_UP_TO intervals otherwise (diag/numeric/window_unions.py: the same
    totals, without importing numba)."""
    if len(keys) < NUMPY_UNIONS_UP_TO and not is_loaded(_window_unions_loop):
        loop = window_unions
    else:
        loop = compiled(_window_unions_loop)

    def ints(values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.int64)

    return loop(
        ints(keys), ints(starts), ints(ends), ints(measures),
        ints(window_keys), ints(window_starts), ints(window_ends), measure_count,
    )  # fmt: skip


def prepare_union_lengths() -> None:
    """Compile (or load from numba's cache) `union_lengths_in_windows`' loop now: a process
    about to fork workers that will run it on large inputs does so once, for all of them."""
    empty = np.zeros(0, dtype=np.int64)
    compiled(_window_unions_loop)(empty, empty, empty, empty, empty, empty, empty, 1)


_BEFORE_ANY_TIME = -(2**63)


def _window_unions_loop(
    keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, measures: np.ndarray,
    window_keys: np.ndarray, window_starts: np.ndarray, window_ends: np.ndarray,
    measure_count: int,
) -> np.ndarray:  # fmt: skip
    """`union_lengths_in_windows`' loop (plain Python that numba compiles unchanged, hence
    one function): the intervals that count somewhere cut to their window and bucketed by
    it (a counting sort, in record order), each bucket sorted by start, then one scan per
    bucket with a running covered-until time per measure. A cut interval left empty adds
    nothing and moves no covered-until time, so it may stay in its bucket."""
    # Each interval's window: its key's offset where the keys are consecutive (a rank's
    # steps), else a binary search; the buckets' sizes.
    windows, count = len(window_keys), len(keys)
    consecutive = windows > 0 and window_keys[windows - 1] - window_keys[0] == windows - 1
    window = np.empty(count, dtype=np.int64)
    bucket_start = np.zeros(windows + 1, dtype=np.int64)
    for i in range(count):
        w = -1
        if measures[i] != 0 and windows > 0:
            if consecutive:
                w = keys[i] - window_keys[0]
                w = w if 0 <= w < windows else -1
            else:
                w = np.searchsorted(window_keys, keys[i])
                w = w if w < windows and window_keys[w] == keys[i] else -1
        window[i] = w
        if w >= 0:
            bucket_start[w + 1] += 1
    for w in range(windows):
        bucket_start[w + 1] += bucket_start[w]
    # The intervals cut to their windows, bucket by bucket, in record order.
    filled = bucket_start[:-1].copy()
    cut_starts = np.empty(bucket_start[windows], dtype=np.int64)
    cut_ends = np.empty(bucket_start[windows], dtype=np.int64)
    cut_bits = np.empty(bucket_start[windows], dtype=np.int64)
    for i in range(count):
        w = window[i]
        if w >= 0:
            at = filled[w]
            cut_starts[at] = max(starts[i], window_starts[w])
            cut_ends[at] = min(ends[i], window_ends[w])
            cut_bits[at] = measures[i]
            filled[w] += 1
    spare_starts = np.empty_like(cut_starts)  # where a merge writes
    spare_ends = np.empty_like(cut_ends)
    spare_bits = np.empty_like(cut_bits)
    largest = 0
    for w in range(windows):
        largest = max(largest, bucket_start[w + 1] - bucket_start[w])
    run_start = np.empty(largest + 1, dtype=np.int64)  # a bucket's runs, then its end
    totals = np.zeros((windows, measure_count), dtype=np.int64)
    covered_until = np.empty(measure_count, dtype=np.int64)
    for w in range(windows):
        low, high = bucket_start[w], bucket_start[w + 1]
        # Sort: find the bucket's runs in start order once, then merge them pairwise, each
        # pass halving them. Records come in a few such runs (a step's spans, then its
        # collectives), so a few passes; the order of equal starts does not change a union.
        s, e, b = cut_starts, cut_ends, cut_bits
        to_s, to_e, to_b = spare_starts, spare_ends, spare_bits
        runs, i = 0, low
        while i < high:
            run_start[runs] = i
            i += 1
            while i < high and s[i] >= s[i - 1]:
                i += 1
            runs += 1
        run_start[runs] = high
        while runs > 1:
            for r in range(0, runs, 2):
                left, middle = run_start[r], run_start[min(r + 1, runs)]
                right, end = middle, run_start[min(r + 2, runs)]
                for k in range(left, end):
                    if right >= end or (left < middle and s[left] <= s[right]):
                        to_s[k], to_e[k], to_b[k] = s[left], e[left], b[left]
                        left += 1
                    else:
                        to_s[k], to_e[k], to_b[k] = s[right], e[right], b[right]
                        right += 1
                run_start[r // 2] = run_start[r]
            runs = (runs + 1) // 2
            run_start[runs] = high
            s, e, b, to_s, to_e, to_b = to_s, to_e, to_b, s, e, b
        # Scan: each interval adds what it covers past the measure's covered-until time.
        covered_until[:] = _BEFORE_ANY_TIME
        for j in range(low, high):
            start, end, bits = s[j], e[j], b[j]
            for k in range(measure_count):
                if (bits >> k) & 1:
                    begin = max(start, covered_until[k])
                    if end > begin:
                        totals[w, k] += end - begin
                        covered_until[k] = end
    return totals
