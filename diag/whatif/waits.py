"""Where each rank's waiting went, read off a timeline (diag/whatif/timeline.py): each wait
split into arrival skew and transfer per rank and group, and each rank's time in no record
split into waiting and its own (docs/metrics.md, "Dependencies")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.whatif import timeline as tl

NS_PER_S = 1e9


def waits_table(timeline: tl.Timeline, steps: int) -> pd.DataFrame:
    """Per rank and group, the measured waiting split into arrival skew (before the last
    member arrived or the send started) and transfer, per step; how often it arrived last."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    a, e = ev["a_ns"].to_numpy(dtype=np.float64), ev["e_ns"].to_numpy(dtype=np.float64)
    rank = ev["rank"].to_numpy()
    group, group_names = pd.factorize(ev["group"], sort=True)  # codes in the names' order
    instance, sender = ev["instance"].to_numpy(), ev["sender"].to_numpy()
    members = timeline.member_event
    owner = np.repeat(np.arange(len(timeline.member_ptr) - 1), np.diff(timeline.member_ptr))
    last_arrival = np.full(len(timeline.member_ptr) - 1, -np.inf)
    np.maximum.at(last_arrival, owner, a[members])
    ready = np.full(len(ev), np.nan)
    sync = np.flatnonzero(kind == tl.Kind.SYNC)
    ready[sync] = last_arrival[instance[sync]]
    recv = np.flatnonzero(kind == tl.Kind.RECV)
    ready[recv] = a[sender[recv]]
    wait_count = np.diff(timeline.wait_ptr)
    waits = np.flatnonzero((kind == tl.Kind.WAIT) & (wait_count > 0))
    if len(waits):  # the latest arrival over the collectives (and sends) each wait waits for
        awaited = timeline.wait_event
        # a launched send is ready when its receive arrives (the receive's sender is the send)
        paired = recv[sender[recv] >= 0]
        receive_of = np.full(len(ev), -1, dtype=np.int64)
        receive_of[sender[paired]] = paired
        awaited_ready = np.where(
            instance[awaited] >= 0,
            last_arrival[np.maximum(instance[awaited], 0)] if len(last_arrival) else np.nan,
            a[np.maximum(receive_of[awaited], 0)],
        )
        ready[waits] = np.maximum.reduceat(awaited_ready, timeline.wait_ptr[waits])
        group[waits] = group[timeline.wait_event[timeline.wait_ptr[waits]]]
    blocking = np.concatenate([sync, recv, waits])
    if not len(blocking):
        return pd.DataFrame(columns=["rank", "group", "skew_s", "transfer_s", "last_share"])
    wait_ns = np.maximum(e[blocking] - a[blocking], 0.0)
    skew_ns = np.minimum(np.maximum(ready[blocking] - a[blocking], 0.0), wait_ns)
    # per (rank, group), in that order: the values are whole ns, their sums exact in any order
    num_groups = len(group_names)
    pairs, pair_of = np.unique(rank[blocking] * num_groups + group[blocking], return_inverse=True)
    skew_s = np.bincount(pair_of, weights=skew_ns) / NS_PER_S / max(steps, 1)
    transfer_s = np.bincount(pair_of, weights=wait_ns - skew_ns) / NS_PER_S / max(steps, 1)
    # who arrived last at each collective (the first of the latest, in event order)
    latest = np.flatnonzero(a[members] == last_arrival[owner])
    latest = latest[np.diff(owner[latest], prepend=-1) != 0]
    last_pair = rank[members[latest]] * num_groups + group[members[latest]]
    in_table = last_pair[np.isin(last_pair, pairs)]
    last = np.bincount(np.searchsorted(pairs, in_table), minlength=len(pairs))
    total = np.bincount(group[members[latest]], minlength=num_groups)[pairs % num_groups]
    return pd.DataFrame({
        "rank": pairs // num_groups,
        "group": np.asarray(group_names, dtype=object)[pairs % num_groups],
        "skew_s": skew_s,
        "transfer_s": transfer_s,
        "last_share": last / np.where(total > 0, total, 1).astype(float),
    })  # fmt: skip


def gaps_table(timeline: tl.Timeline, steps: int) -> pd.DataFrame:
    """Per rank, per step: its time in no record before events, read as waiting and as its own.
    A synchronisation inferred from the ranks' resuming together is time in no record that was
    waiting, whole."""
    ev = timeline.events
    inferred = ev["inferred"].to_numpy(dtype=bool) if "inferred" in ev else np.zeros(len(ev), bool)
    span = (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64) * inferred
    gap = ev["gap_ns"].to_numpy(dtype=np.float64) + span
    waited = ev["gap_wait_ns"].to_numpy(dtype=np.float64) + span
    frame = pd.DataFrame({"rank": ev["rank"].to_numpy(), "waiting_s": waited,
                          "own_s": np.clip(gap - waited, 0, None)})  # fmt: skip
    table = frame.groupby("rank", as_index=False)[["waiting_s", "own_s"]].sum()
    table[["waiting_s", "own_s"]] /= NS_PER_S * max(steps, 1)
    return table
