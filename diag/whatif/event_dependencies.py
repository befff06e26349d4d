"""What each event of a timeline (diag/whatif/timeline.py) waits for: the members of each
collective and their transfers, the send each receive waits for, the launches each wait waits
for, and the part of the time in no record before an event that was waiting."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.numeric.compiled import for_size
from diag.whatif.timeline_model import MIN_WAITING_GAP_NS, WAIT_SLACK_NS, Kind, Timeline

GAP_END_TOLERANCE_NS = 100_000
GAP_END_TOLERANCE_SHARE = 0.02
"""A gap ends when its dependency became ready if the two lie within the larger of these
(ns, share of the gap) of each other: a rank wakes up a little after what it waited for."""
LAUNCH_KIND, WAIT_KIND = int(Kind.LAUNCH), int(Kind.WAIT)
"""As plain ints, for the compiled scan of waits."""


def dependencies(
    timeline: Timeline,
    recv_rows: np.ndarray,
    send_rows: np.ndarray,
    one_way: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Members of each collective, transfers, what each wait and receive waits for; `one_way`:
    receives (rows) and a send each waits for that is another receive's (a rank standing in
    for an untraced one: lockstep.surrogate_message_rows)."""
    ev = timeline.events
    kind = ev["kind"].to_numpy().copy()
    a, e = ev["a_ns"].to_numpy(dtype=np.int64), ev["e_ns"].to_numpy(dtype=np.int64)
    raw = ev["instance"].to_numpy()
    in_instance = np.flatnonzero((raw >= 0) & np.isin(kind, [Kind.SYNC, Kind.LAUNCH]))
    codes, uniques = pd.factorize(raw[in_instance])  # dense ids 0..I-1, in order of first event
    instance = np.full(len(ev), -1, dtype=np.int64)
    instance[in_instance] = codes
    sender = _senders(ev, kind, recv_rows, send_rows)
    standing = np.zeros(len(ev), dtype=bool)
    if one_way is not None and len(one_way[0]):
        taking = _senders(ev, np.full(len(kind), Kind.LOCAL), *one_way)  # no rendezvous
        standing = (sender < 0) & (taking >= 0)
        sender = np.where(standing, taking, sender)
    waited = _waiting_gaps(ev, kind, instance, len(uniques), sender)
    a = a - waited  # a rank that waited in a gap arrived when the gap began
    ev["a_ns"] = a
    ev["seg_ns"] = ev["seg_ns"].to_numpy() - waited
    ev["host_ns"] = np.clip(ev["host_ns"].to_numpy() - waited, 0, None)
    ev["gap_wait_ns"] = waited
    last_arrival = np.full(len(uniques), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last_arrival, codes, a[in_instance])
    transfer = np.zeros(len(ev), dtype=np.int64)
    transfer[in_instance] = np.maximum(e[in_instance] - last_arrival[codes], 0)
    by_instance = in_instance[np.argsort(codes, kind="stable")]
    timeline.member_ptr = np.concatenate(
        [[0], np.cumsum(np.bincount(codes, minlength=len(uniques)))]
    )
    timeline.member_event = by_instance.astype(np.int64)
    paired = np.flatnonzero(sender >= 0)  # receives, and blocking sends
    transfer[paired] = np.maximum(e[paired] - np.maximum(a[paired], a[sender[paired]]), 0)
    unmatched = (kind == Kind.RECV) & (sender < 0)
    kind[unmatched] = Kind.LOCAL
    # waits: the launches of this rank since the last wait that completed by the wait's end
    ready = np.full(len(ev), np.iinfo(np.int64).min, dtype=np.int64)
    ready[in_instance] = last_arrival[codes]
    # a launched send that ran until its receive arrived (a GPU's send kernel runs until the
    # receiver's kernel takes the message) completes once both sides are there, plus its own
    # rest: a wait may wait for it. One that ended before (a buffered send, gloo's) completed
    # on its own, as measured.
    receives = np.flatnonzero((kind == Kind.RECV) & (sender >= 0) & ~standing)
    receives = receives[kind[sender[receives]] == Kind.LAUNCH]
    held = e[sender[receives]] + WAIT_SLACK_NS >= a[receives]
    launched_sends = sender[receives[held]]
    # its transfer: from the moment both sides were there to its own end
    both_there = np.maximum(a[launched_sends], a[receives[held]])
    transfer[launched_sends] = np.maximum(e[launched_sends] - both_there, 0)
    awaitable = np.zeros(len(ev), dtype=np.bool_)
    awaitable[in_instance] = True
    awaitable[launched_sends] = True
    count, awaited, by_arrival, post = for_size(awaited_launches, len(ev))(
        kind.astype(np.int64), awaitable, a, e, ready, timeline.first.astype(np.int64),
        WAIT_SLACK_NS, MIN_WAITING_GAP_NS,
    )  # fmt: skip
    timeline.wait_ptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    timeline.wait_event = awaited
    timeline.wait_by_arrival = by_arrival
    kind[(kind == Kind.WAIT) & (count == 0)] = Kind.LOCAL  # a wait on nothing we saw (a send's)
    ev["kind"] = kind
    ev["instance"] = instance
    ev["transfer_ns"] = transfer
    ev["post_ns"] = post
    ev["sender"] = sender
    ev["one_way"] = standing  # its send is another receive's: the replay leaves it alone


def _senders(
    ev: pd.DataFrame, kind: np.ndarray, recv_rows: np.ndarray, send_rows: np.ndarray
) -> np.ndarray:
    """Per event, the event of the send a receive waits for, and the receive a blocking send
    (a RECV event) waits for (rows of comms -> events); -1 elsewhere."""
    source = ev["source"].to_numpy()
    event_of_row = np.full(max(int(source.max()) + 1, 0) if len(source) else 0, -1, dtype=np.int64)
    has_row = np.flatnonzero(source >= 0)
    event_of_row[source[has_row]] = has_row
    sender = np.full(len(ev), -1, dtype=np.int64)
    if len(recv_rows):
        recv_event, send_event = event_of_row[recv_rows], event_of_row[send_rows]
        seen = (recv_event >= 0) & (send_event >= 0)
        recv_event, send_event = recv_event[seen], send_event[seen]
        sender[recv_event] = send_event
        rendezvous = kind[send_event] == Kind.RECV
        sender[send_event[rendezvous]] = recv_event[rendezvous]
    return sender


def _waiting_gaps(
    ev: pd.DataFrame, kind: np.ndarray, instance: np.ndarray, instances: int, sender: np.ndarray
) -> np.ndarray:
    """Per event, the part of the time in no record right before it (`gap_ns`) that was
    waiting: the gap ends, within GAP_END_TOLERANCE, when what the event depends on became
    ready (the last other member's arrival at its collective, its receive's send) and that
    moment falls inside the gap. A rank blocked where nothing recorded it (a device
    synchronisation, an untimed wait) resumes then; a rank busy with unrecorded work of its
    own (Python, a data fetch, a sleep) resumes whenever that work ends. 0 elsewhere."""
    a = ev["a_ns"].to_numpy(dtype=np.int64)
    gap = ev["gap_ns"].to_numpy(dtype=np.int64)
    ready = np.full(len(ev), np.iinfo(np.int64).min, dtype=np.int64)
    members = np.flatnonzero(instance >= 0)
    if len(members):  # the latest arrival of the other members: the two latest per collective
        codes = instance[members]
        order = np.lexsort((a[members], codes))
        ordered_codes, ordered_a = codes[order], a[members][order]
        last = np.flatnonzero(np.append(ordered_codes[1:] != ordered_codes[:-1], True))
        latest = np.full(instances, np.iinfo(np.int64).min, dtype=np.int64)
        second = np.full(instances, np.iinfo(np.int64).min, dtype=np.int64)
        latest[ordered_codes[last]] = ordered_a[last]
        has_second = (last >= 1) & (ordered_codes[np.maximum(last - 1, 0)] == ordered_codes[last])
        second[ordered_codes[last[has_second]]] = ordered_a[last[has_second] - 1]
        sync = np.flatnonzero((kind == Kind.SYNC) & (instance >= 0))
        own = a[sync]
        ready[sync] = np.where(own == latest[instance[sync]], second[instance[sync]],
                               latest[instance[sync]])  # fmt: skip
    recv = np.flatnonzero((kind == Kind.RECV) & (sender >= 0))
    ready[recv] = a[sender[recv]]
    tolerance = np.maximum(GAP_END_TOLERANCE_NS, gap * GAP_END_TOLERANCE_SHARE)
    began = a - gap
    waiting = (
        (gap >= MIN_WAITING_GAP_NS) & (ready > began + tolerance) & (np.abs(a - ready) <= tolerance)
    )
    return np.where(waiting, np.minimum(ready, a) - began, 0).astype(np.int64)


def awaited_launches(kind, awaitable, a, e, ready, first, slack_ns, min_wait_ns):  # fmt: skip
    """Per event, how many launches it waits for (WAIT events only), those launches in event
    order, whether each wait is released by the launch's last arrival rather than its
    completion, and each wait's time after what released it (post_ns). A wait waits for a
    launch that completed by its end (`awaitable`: a collective's member, or a send whose
    receive was matched); or, inside a launch's interval, for one whose last member arrived
    during the wait (a profiler's view of a backend thread: the collective's record runs on
    after the rank was released). Plain Python that numba compiles
    (diag/numeric/compiled.py)."""
    n = len(kind)
    count = np.zeros(n, dtype=np.int64)
    awaited = np.empty(n, dtype=np.int64)
    by_arrival = np.zeros(n, dtype=np.bool_)
    post = np.zeros(n, dtype=np.int64)
    filled = 0
    pending = np.empty(n, dtype=np.int64)
    for r in range(len(first) - 1):
        waiting = 0
        for k in range(first[r], first[r + 1]):
            if kind[k] == LAUNCH_KIND and awaitable[k]:
                pending[waiting] = k
                waiting += 1
            elif kind[k] == WAIT_KIND:
                completed = a[k]
                kept = 0
                for i in range(waiting):
                    p = pending[i]
                    if e[p] <= e[k] + slack_ns:
                        awaited[filled] = p
                        filled += 1
                        count[k] += 1
                        completed = max(completed, e[p])
                    elif (e[k] - a[k] >= min_wait_ns and a[p] <= a[k]
                          and a[k] < ready[p] <= e[k]):  # fmt: skip
                        awaited[filled] = p
                        by_arrival[filled] = True
                        filled += 1
                        count[k] += 1
                        completed = max(completed, ready[p])
                    else:
                        pending[kept] = p
                        kept += 1
                waiting = kept
                if count[k] == 0:
                    completed = a[k]
                post[k] = max(e[k] - max(a[k], completed), 0)
    return count, awaited[:filled].copy(), by_arrival[:filled].copy(), post
