"""Waiting for group members nobody traced (one traced rank per tensor-parallel group).

A profiler trace often holds only some ranks: one per tensor-parallel group is common. The
traced rank's collectives in that group then have no other member in the records, so the
replay cannot match them (diag/whatif/matching.py) and holds each at its measured length. But
a GPU collective runs from its rank's arrival until the last member arrives, plus the
transfer (docs/metrics.md, "Waiting inside GPU communication kernels"): the part beyond the
transfer is the untraced members' lateness, their local time, which varies from step to step
as the traced rank's own does. Held fixed, that variation leaves the replay, and random
imbalance split between traced and untraced ranks reads as none.

So where a collective's group (manifest.groups) has members without a single record, its
record is read as arriving when its transfer began: its length less the shortest that rank
ever took for the same op, group and size (a collective its rank reached last is all
transfer). The time before it then counts as the traced rank's local time: the rank stands
for its whole group, as the ranks of a tensor-parallel group move in lockstep. Collectives
whose members are all traced are matched as usual and left alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.whatif.matching import P2P_OPS


def arrivals_with_absent_members(
    comms: pd.DataFrame, stand_in: np.ndarray, sizes: np.ndarray | None = None
) -> np.ndarray:
    """Each comm row's arrival (t0), later for the collectives whose rank stands for untraced
    members (`stand_in` > 0, `stand_ins`), by the time they waited for those members (see the
    module's text); `sizes`: each row's bytes (NaN: unknown), collectives of different sizes
    being apart."""
    t0 = comms["t0"].to_numpy(dtype=np.int64).copy()
    alone = stand_in > 0
    if not alone.any():
        return t0
    rows = np.flatnonzero(alone)
    t1 = comms["t1"].to_numpy(dtype=np.int64)
    if sizes is None:
        sizes = np.full(len(comms), np.nan)
    table = pd.DataFrame({
        "rank": comms["rank"].to_numpy(dtype=np.int64)[rows],
        "group": comms["group"].astype(object).to_numpy()[rows].astype(str),
        "op": comms["op"].astype(object).to_numpy()[rows].astype(str),
        "bytes": np.asarray(sizes, dtype=np.float64)[rows],
        "length": np.maximum(t1[rows] - t0[rows], 0),
    })  # fmt: skip
    keys = ["rank", "group", "op", "bytes"]
    transfer = table.groupby(keys, dropna=False)["length"].transform("min").to_numpy()
    t0[rows] = t1[rows] - transfer
    return t0


def stand_ins(comms: pd.DataFrame, instance: np.ndarray, manifest: schema.Manifest) -> np.ndarray:
    """Per comm row, how many members without a single record its rank stands for: in a
    collective matched to no traced member (instance < 0, no message) of a group
    (manifest.groups) with untraced members, those members over the group's traced ones (one
    traced rank per TP group of tp: tp - 1); 0 elsewhere."""
    out = np.zeros(len(comms))
    if comms.empty:
        return out
    traced = set(np.unique(comms["rank"].to_numpy(dtype=np.int64)).tolist())
    share: dict[tuple[str, int], float] = {}  # (axis, traced rank) -> untraced per traced
    for axis, groups in manifest.groups.items():
        for members in groups:
            mine = traced.intersection(members)
            if mine and len(mine) < len(members):
                for rank in mine:
                    share[(str(axis), rank)] = (len(set(members)) - len(mine)) / len(mine)
    if not share:
        return out
    groups = comms["group"].astype(object).to_numpy()
    ranks = comms["rank"].to_numpy(dtype=np.int64)
    ops = comms["op"].astype(object).to_numpy()
    alone = (instance < 0) & ~np.isin(ops, list(P2P_OPS))
    rows = np.flatnonzero(alone)
    keys = pd.MultiIndex.from_arrays([groups[rows].astype(str), ranks[rows]])
    out[rows] = pd.Series(share, dtype=np.float64).reindex(keys).fillna(0.0).to_numpy()
    return out


def lone_launches(
    comms: pd.DataFrame,
    instance: np.ndarray,
    stand_in: np.ndarray,
    launched: np.ndarray,
    sizes: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The asynchronous collectives (`launched`: awaited later, not where they are issued)
    matched to no traced member (`instance` < 0) whose rank stands for untraced members
    (`stand_in` > 0), and per row the time each waited for those members (its length less
    the shortest of its rank, op, group and size, `sizes` as in
    `arrivals_with_absent_members`; 0 elsewhere).

    A blocking one is read as arriving when its transfer began, the time before it the
    rank's own. An asynchronous one cannot be: its rank went on after the launch, and its
    wait (a data-parallel gradient all-reduce whose partner left no trace) sits in the later
    wait on it, which, awaiting no collective the replay knew, was held at its measured
    length, so no counterfactual moved it: the untraced partner's lateness could not be
    costed (a dp2 x tp2 x pp4 job whose straggler's one trace was lost read its waiting as
    0.4 ms). The timeline makes each its own collective, launched at its measured time and
    complete after its measured length, of which the waiting for the members is
    late_members_ns (diag/whatif/late_members.py): on time, they remove it."""
    lone = (stand_in > 0) & launched & (instance < 0)
    if not lone.any():
        return lone, np.zeros(len(comms))
    arrived = arrivals_with_absent_members(comms, lone.astype(np.float64), sizes)
    waited = arrived - comms["t0"].to_numpy(dtype=np.int64)
    return lone, np.where(lone, waited, 0).astype(np.float64)


ARRIVED_LAST_SLACK_NS = 10_000
ARRIVED_LAST_SLACK_SHARE = 0.10
"""A wait for untraced members shorter than the larger of these (ns; share of the transfer)
is the transfer's own variation (the shortest transfer is the zero of every wait): the traced
rank arrived last."""


def waited_for_members(absent_ns: np.ndarray, transfer_ns: np.ndarray) -> np.ndarray:
    """Per event, whether its rank waited for the untraced members it stands for beyond the
    transfer's own variation (the slack above): an untraced member arrived after it.
    `transfer_ns`: each event's time from its arrival to its end."""
    slack = np.maximum(ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE * transfer_ns)
    return absent_ns > slack


def members_own_time(
    seg_ns: np.ndarray,
    absent_ns: np.ndarray,
    transfer_ns: np.ndarray,
    stand_in: np.ndarray,
    places: np.ndarray,
) -> np.ndarray:
    """Per event, the mean own time before it of the rank and of the untraced members it
    stands for (`stand_in` of them, `stand_ins`); the rank's own time (`seg_ns` less
    `absent_ns`) where it stands for none. `transfer_ns`: each event's time from its arrival
    to its end; `places`: one code per place of a stage's step (the same work), over steps.

    Where an untraced member arrived after the rank (it waited for it), the last to arrive
    took all of `seg_ns` (the rank's local time up to the transfer, the wait included): that
    member's time is measured. Where the rank arrived last, the others are only known to have
    taken less. A member that did not arrive last is taken at the mean of the traced ranks'
    own times at the same place (any step) below the last's time (which member of a group is
    traced does not depend on which is late, so the traced ranks' times are a sample of the
    members'; truncated at the last's, of those that took less), at most `seg_ns`; where no
    traced time lies below it, at the rank's own time. Taking the traced ranks' own time
    alone for the stage's mean (half its ranks with one of two traced per group) left out
    the measured last members: the mean, and the imbalance replay leveling to it, was
    noisier and read low (simulated 16-rank jitter jobs: the cost within 20% of their run
    directories' in 6 of 14, mean -20%). Taking those members at the mean of the traced
    ranks that were not last either (the shorter of two times, whatever the last's) read
    them low where the last took long: the cost within 20% in 14 of 18 dp2 x tp2 x pp4
    jitter jobs (4 steps, seeds 0-8, 1F1B and interleaved; from -26% to +23%, mean |error|
    14%); truncated at the last's time, in 18 of 18 (-18% to +16%, mean |error| 11%;
    docs/metrics.md)."""
    own = np.clip(seg_ns - absent_ns, 0, None)
    standing = stand_in > 0
    if not standing.any():
        return own
    waited = standing & waited_for_members(absent_ns, transfer_ns)
    # a member not last took less than the last: the traced ranks' own times at the place
    # (any step) below that bound are a sample of such times
    bound = np.where(waited, seg_ns, own)
    earlier = np.full(len(own), np.nan)
    earlier[standing] = mean_below(own[standing], np.asarray(places)[standing], bound[standing])
    earlier = np.minimum(np.where(np.isnan(earlier), own, earlier), seg_ns)
    last = waited.astype(np.float64)  # the measured member: one at most
    rest = np.clip(stand_in - last, 0, None)
    mean = (own + last * seg_ns + rest * earlier) / (1 + last + rest)
    return np.where(standing, mean, own)


def mean_below(values: np.ndarray, places: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Per element, the mean of the `values` of its place (NaN: none) strictly below its
    `bound`; NaN where none is. One sort of the values and bounds together: per place, by
    time, a bound before a value equal to it."""
    known = ~np.isnan(values)
    n, m = int(known.sum()), len(bound)
    place = np.concatenate([np.asarray(places)[known], np.asarray(places)])
    time = np.concatenate([values[known], bound])
    is_value = np.concatenate([np.ones(n, dtype=bool), np.zeros(m, dtype=bool)])
    order = np.lexsort((is_value, time, place))
    place, time, is_value = place[order], time[order], is_value[order]
    count = np.cumsum(is_value)
    total = np.cumsum(np.where(is_value, time, 0.0))
    # what came before each element's place in the sorted order
    first = np.r_[True, place[1:] != place[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(len(place)), 0))
    count_before = (count - is_value)[start]
    total_before = (total - np.where(is_value, time, 0.0))[start]
    taken = count - count_before
    summed = total - total_before
    with np.errstate(invalid="ignore", divide="ignore"):
        out_sorted = np.where(taken > 0, summed / np.maximum(taken, 1), np.nan)
    out = np.empty(m)
    bounds_at = order[~is_value] - n  # each bound's element
    out[bounds_at] = out_sorted[~is_value]
    return out
