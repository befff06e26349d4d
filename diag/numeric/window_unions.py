"""`union_lengths_in_windows` (diag/numeric/intervals.py) in numpy: the same integer totals as the
compiled loop, without numba. A process that has not imported numba (a profiler trace's
analysis: importing it and loading the cached loop costs about 0.4 s) measures here, in a few
sorts, what the loop measures in one pass.

Each measure is one grouped union: its intervals cut to their windows and sorted by (window,
start); an interval adds the part of it past the latest end before it in its window. That
running maximum restarts at each window without a per-window loop: the ends are replaced by
their ranks among all ends (order kept, values below the count), and window w's ranks shifted
by w times the count, so a running maximum over the whole array never carries one window's
value into the next.
"""

from __future__ import annotations

import numpy as np


def window_unions(
    keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, measures: np.ndarray,
    window_keys: np.ndarray, window_starts: np.ndarray, window_ends: np.ndarray,
    measure_count: int,
) -> np.ndarray:  # fmt: skip
    """For each window and each bit k < measure_count, the measure of the union of the
    intervals of the window's key whose `measures` has bit k, cut to the window (windows x
    measure_count, int64). Arguments as `union_lengths_in_windows` takes them (int64 arrays,
    `window_keys` ascending and distinct)."""
    windows = len(window_keys)
    totals = np.zeros((windows, measure_count), dtype=np.int64)
    if windows == 0 or len(keys) == 0:
        return totals
    window = np.searchsorted(window_keys, keys)
    found = window < windows
    found[found] = window_keys[window[found]] == keys[found]
    counted = found & (measures != 0)
    window = window[counted]
    cut_starts = np.maximum(starts[counted], window_starts[window])
    cut_ends = np.minimum(ends[counted], window_ends[window])
    bits = measures[counted]
    nonempty = cut_ends > cut_starts  # an empty cut adds nothing and moves no end
    window, cut_starts, cut_ends, bits = (
        window[nonempty], cut_starts[nonempty], cut_ends[nonempty], bits[nonempty],
    )  # fmt: skip
    for k in range(measure_count):
        mine = ((bits >> k) & 1).astype(bool)
        totals[:, k] = _grouped_union(window[mine], cut_starts[mine], cut_ends[mine], windows)
    return totals


def _grouped_union(
    group: np.ndarray, starts: np.ndarray, ends: np.ndarray, groups: int
) -> np.ndarray:
    """The union's measure per group 0..groups-1 of non-empty intervals (int64, exact)."""
    out = np.zeros(groups, dtype=np.int64)
    count = len(group)
    if count == 0:
        return out
    order = np.lexsort((starts, group))
    group, starts, ends = group[order], starts[order], ends[order]
    by_end = np.argsort(ends, kind="stable")
    rank = np.empty(count, dtype=np.int64)
    rank[by_end] = np.arange(count, dtype=np.int64)
    shift = group * count
    latest = np.maximum.accumulate(rank + shift) - shift  # rank of the latest end so far
    covered_until = ends[by_end][latest]
    first = np.ones(count, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    begin = starts.copy()
    later = ~first
    begin[later] = np.maximum(starts[later], covered_until[:-1][later[1:]])
    gain = np.clip(ends - begin, 0, None)
    sums = np.cumsum(gain)
    firsts = np.flatnonzero(first)
    lasts = np.append(firsts[1:], count) - 1
    group_total = sums[lasts] - np.concatenate([[0], sums[lasts[:-1]]])
    out[group[firsts]] = group_total
    return out
