"""The local time before each event of a timeline (diag/whatif/timeline.py): how long since the
rank's previous event, its host part (outside compute spans), and its time in no record."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.numeric.ordering import dense_key, occurrence
from diag.whatif.timeline_model import Kind, Timeline

LAUNCH_PLACES = 1_000_000
"""Launches are numbered from here within a step (chain events from 0)."""
HOST_PHASES = frozenset({schema.Phase.DATA.value})
COMPUTE_PHASES = schema.COMPUTE_PHASES - HOST_PHASES


def previous_step_ends(
    recorded: pd.DataFrame, analysed: pd.DataFrame, ranks: np.ndarray
) -> np.ndarray:
    """Per rank (in `ranks` order), the end of the step it recorded just before its first analysed
    one (a warm-up step, or the step before a window), or -1 where there is none: the time
    between the two is the first analysed step's host time (a data fetch before it)."""
    first = analysed.groupby("rank")["step"].min()
    ends = np.full(len(ranks), -1, dtype=np.int64)
    if recorded.empty:
        return ends
    earlier = recorded[recorded["step"] < recorded["rank"].map(first)]
    if earlier.empty:
        return ends
    latest = earlier.sort_values("step").groupby("rank")["t1"].last()
    ends[:] = latest.reindex(ranks).fillna(-1).to_numpy(dtype=np.int64)
    return ends


def local_time(timeline: Timeline, spans: pd.DataFrame, previous_step_end: np.ndarray) -> None:
    """seg_ns (local time before each event), host_ns (its part outside compute spans), j.
    A rank's first event (the START of its first analysed step) is timed from the end of the
    step before it where one was recorded (`previous_step_end`, -1: none)."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    a, e = ev["a_ns"].to_numpy(dtype=np.int64), ev["e_ns"].to_numpy(dtype=np.int64)
    # an event ends where the rank goes on: marks at once, others at their end. A launch is
    # a side branch: it is timed from the chain's previous event (its end, or its start when
    # the launch came while that event was still blocking) and does not move the chain on.
    goes_on = np.where(np.isin(kind, [Kind.START, Kind.END]), a, e)
    launch = kind == Kind.LAUNCH
    before = _previous_in_chain(launch, timeline.first)
    # through float64 as the earlier pandas version did (its NaN for "none"): absolute clocks
    # round to 256 ns here; kept so that the reports do not change with the vectorising
    chained = before >= 0
    previous_end = np.where(chained, goes_on[before], a).astype(np.float64).astype(np.int64)
    previous_start = np.where(chained, a[before], a).astype(np.float64).astype(np.int64)
    starts = timeline.first[:-1]
    opening = (previous_step_end >= 0) & (previous_step_end <= a[starts])
    previous_end[starts[opening]] = previous_step_end[opening]
    # one batched kernel's ops (Megatron's batch_isend_irecv: a receive and a send, each with
    # the kernel's interval where a peer left no trace) ran together: the later in the chain
    # is timed from their common start too, and the rank goes on when both are done
    # (replay.py); played one after the other, the kernel's time counted twice (a dp2 x pp4
    # job whose straggler's trace was lost replayed its step 61% long)
    message = np.isin(kind, [Kind.RECV, Kind.LOCAL])
    batched = message & chained & message[np.where(chained, before, 0)] & (
        a == previous_start) & (a < previous_end)  # fmt: skip
    from_start = (launch & (a < previous_end)) | batched
    reference = np.where(from_start, previous_start, previous_end)
    seg = np.maximum(a - reference, 0)
    ev["from_start"] = from_start
    previous_end = reference
    compute = np.zeros(len(ev), dtype=np.int64)
    working = spans[spans["phase"].isin(COMPUTE_PHASES)].sort_values("rank", kind="stable")
    span_rank = working["rank"].to_numpy()
    t0s, t1s = working["t0"].to_numpy(np.int64), working["t1"].to_numpy(np.int64)
    for rank, lo, hi in zip(timeline.ranks, starts, timeline.first[1:], strict=True):
        first, after = np.searchsorted(span_rank, [rank, rank + 1])
        covered = _coverage(t0s[first:after], t1s[first:after])
        x, y = previous_end[lo:hi], np.maximum(a[lo:hi], previous_end[lo:hi])
        compute[lo:hi] = covered(y) - covered(x)
    ev["seg_ns"] = seg
    ev["host_ns"] = np.clip(seg - compute, 0, None)
    ev["gap_ns"] = _trailing_gaps(timeline, spans, reference, a)
    # the place of an event in its step, for comparing a rank with its peers: chain events
    # and launches are numbered apart (a launch's order against the chain varies with timing)
    place = occurrence(dense_key(ev["rank"].to_numpy(), ev["step"].to_numpy(), launch))
    ev["j"] = place + np.where(launch, LAUNCH_PLACES, 0)


def _trailing_gaps(
    timeline: Timeline, spans: pd.DataFrame, reference: np.ndarray, a: np.ndarray
) -> np.ndarray:
    """Per event, the time in no record right before it: from the later of the end of the
    local time's start (`reference`) and the last end of any span before the event, to the
    event."""
    recorded = spans[spans["phase"] != schema.Phase.COMM_WAIT.value].sort_values(
        "rank", kind="stable"
    )
    span_rank = recorded["rank"].to_numpy()
    t0s, t1s = recorded["t0"].to_numpy(np.int64), recorded["t1"].to_numpy(np.int64)
    gaps = np.zeros(len(a), dtype=np.int64)
    for rank, lo, hi in zip(timeline.ranks, timeline.first[:-1], timeline.first[1:], strict=True):
        first, after = np.searchsorted(span_rank, [rank, rank + 1])
        covered_until = _last_covered(t0s[first:after], t1s[first:after], a[lo:hi])
        gaps[lo:hi] = np.clip(a[lo:hi] - np.maximum(reference[lo:hi], covered_until), 0, None)
    return gaps


def _last_covered(t0: np.ndarray, t1: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in `t`, the latest moment at or before it that an interval [t0, t1)
    covers (the minimum int64 where none does)."""
    out = np.full(len(t), np.iinfo(np.int64).min, dtype=np.int64)
    if len(t0) == 0:
        return out
    order = np.argsort(t0, kind="stable")
    starts, reach = t0[order], np.maximum.accumulate(t1[order])
    i = np.searchsorted(starts, t, side="right") - 1  # the last interval starting by then
    ok = i >= 0
    out[ok] = np.minimum(t[ok], reach[i[ok]])
    return out


def _previous_in_chain(launch: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per event, the index of the rank's latest earlier event that is not a launch (the
    chain's previous event), or -1 where there is none (`first`: each rank's first event)."""
    position = np.arange(len(launch))
    latest = np.maximum.accumulate(np.where(launch, -1, position))  # up to and with each event
    before = np.concatenate([[-1], latest[:-1]])
    rank_first = np.repeat(first[:-1], np.diff(first))
    return np.where(before >= rank_first, before, -1)


def _coverage(t0: np.ndarray, t1: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A function: how much of (-inf, t) the union of the intervals [t0, t1) covers."""
    if len(t0) == 0:
        return lambda t: np.zeros(len(t), dtype=np.int64)
    order = np.argsort(t0, kind="stable")
    t0, reach = t0[order], np.maximum.accumulate(t1[order])
    new_run = np.ones(len(t0), dtype=bool)
    new_run[1:] = t0[1:] > reach[:-1]  # starts after every earlier interval ended
    lo = t0[new_run]
    hi = np.maximum.reduceat(reach, np.flatnonzero(new_run))
    before = np.concatenate([[0], np.cumsum(hi - lo)])  # covered by the runs before run i

    def covered(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(lo, t, side="right") - 1
        out = np.zeros(len(t), dtype=np.int64)
        ok = i >= 0
        k = i[ok]
        out[ok] = before[k] + np.minimum(t[ok], hi[k]) - lo[k]
        return out

    return covered
