"""Each rank's analysed steps as a sequence of events and the local time between them: what the
replay (diag/whatif/replay.py) plays back, and what the counterfactuals change.

Events, in the order each rank met them:
- `START`/`END` of a step: marks, no time of their own. The local time before a `START` is the
  rank's time outside any step (a data loader, logging, GC between steps): host time.
- `SYNC`: a blocking collective; it ends when its last member arrives plus its transfer.
- `LAUNCH`: an asynchronous collective started (DDP buckets during backward); it completes
  like a `SYNC`, but the rank goes on.
- `WAIT`: a wait (`comm_wait` span) on the asynchronous collectives launched before it.
- `RECV`: a blocking receive; it ends when the matching send has started plus the message. A
  blocking send of a matched message is one too, waiting for its receive likewise, and so is
  a send recorded as asynchronous that held its rank until its late receive came (nothing
  else recorded meanwhile, no wait on it).
- `LOCAL`: anything else with a duration of its own (a send, a collective matched to no peer).

The local time before an event (`seg_ns`) is split into compute (fwd, bwd, opt, kernels,
copies) and host time (data spans and time in no span at all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.numeric.compiled import for_size
from diag.numeric.keys import in_steps
from diag.numeric.ordering import dense_key, lexicographic, occurrence
from diag.read.load import RunData
from diag.whatif.absent_members import arrivals_with_absent_members
from diag.whatif.matching import P2P_OPS, collective_instances, message_pair_rows
from diag.whatif.untraced import inferred_syncs


class Kind(IntEnum):
    START = 0
    LAUNCH = 1
    SYNC = 2
    RECV = 3
    WAIT = 4
    LOCAL = 5
    END = 6


_SORT_ORDER = {Kind.START: 0, Kind.LAUNCH: 1, Kind.SYNC: 2, Kind.RECV: 2, Kind.LOCAL: 2,
               Kind.WAIT: 3, Kind.END: 4}  # fmt: skip
"""At one instant (and within one step: a step ends before the next starts): a step starts first
and ends last; a launch comes before the wait on it."""
LAUNCH_PLACES = 1_000_000
"""Launches are numbered from here within a step (chain events from 0)."""
WAIT_SLACK_NS = 10_000
"""A wait depends on the launches that completed by its end (within this): a collective still
running after the wait ended (a profiler's view of a backend thread) did not hold it."""
MIN_WAITING_GAP_NS = 200_000
"""Time in no record shorter than this is never read as waiting (the launch of the next
operator, Python between two calls)."""
GAP_END_TOLERANCE_NS = 100_000
GAP_END_TOLERANCE_SHARE = 0.02
"""A gap ends when its dependency became ready if the two lie within the larger of these
(ns, share of the gap) of each other: a rank wakes up a little after what it waited for."""
LAUNCH_KIND, WAIT_KIND = int(Kind.LAUNCH), int(Kind.WAIT)
"""As plain ints, for the compiled scan of waits."""
HOST_PHASES = frozenset({schema.Phase.DATA.value})
COMPUTE_PHASES = schema.COMPUTE_PHASES - HOST_PHASES


@dataclass
class Timeline:
    """Events of every rank, rank after rank in the order met (`first[r]:first[r+1]`)."""

    ranks: np.ndarray  # the ranks, ascending
    first: np.ndarray  # index of each rank's first event; one more entry at the end
    events: pd.DataFrame
    """rank, step, kind, a_ns, e_ns (arrival and measured end: the arrival is the measured
    start, earlier by `gap_wait_ns` where the rank waited in a gap before it), seg_ns and
    host_ns (local time before the event, and its host part), gap_ns (its time in no record
    right before the event), j (position in its step), instance, group,
    transfer_ns (SYNC, LAUNCH, RECV: from the last arrival, or the send, to the end), inferred
    (a synchronisation inferred from time in no record, diag/whatif/untraced.py), absent_ns
    (the part of seg_ns spent waiting for group members nobody traced: the arrival moved to
    when the transfer began, diag/whatif/absent_members.py), post_ns
    (WAIT: after the last awaited collective completed), sender (RECV: the send's event)."""
    member_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    member_event: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The member events of collective instance i: member_event[member_ptr[i]:member_ptr[i+1]]
    (instance ids are dense, 0..I-1, in `events.instance`)."""
    wait_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    wait_event: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The LAUNCH events WAIT event k waits for: wait_event[wait_ptr[k]:wait_ptr[k+1]]."""
    wait_by_arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    """Per entry of wait_event: the wait is released by that collective's last arrival, not
    its completion."""
    notes: list[str] = field(default_factory=list)
    ambiguous: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The gaps this timeline reads as the rank's own time though its group's ranks resumed
    closer together than they arrived (`readings`): rank, step, before, gap_ns."""
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What readers of the finished timeline compute from it once and keep for their next call
    (the replay's input arrays, diag/whatif/replay.py); the events do not change after
    `build`."""


COMMS_COLUMNS = ["rank", "step", "op", "group", "tag", "t0", "t1", "async"]
SPANS_COLUMNS = ["rank", "step", "phase", "t0", "t1"]
"""The columns the timeline reads (and the matching of collectives and messages): the
records of the analysed steps are taken with these only."""
PEER_COLUMN = "peer"
"""A message's other side where the records name it (profiler traces): read too when there."""


def build(run: RunData, steps: pd.DataFrame) -> Timeline:
    """The timeline of `steps` (the analysed step records: rank, step, t0, t1), every gap
    whose reading is ambiguous read as the rank's own time (`readings`)."""
    return readings(run, steps)[0]


def readings(run: RunData, steps: pd.DataFrame) -> tuple[Timeline, Timeline | None]:
    """The timeline of `steps`, and where the evidence leaves some gaps' reading ambiguous
    (diag/whatif/untraced.py), the timeline with those gaps read as waiting in a
    synchronisation of their group (None where none is). The first keeps, in `ambiguous`, the
    time of each such gap: rank, step, before (what it ended at), gap_ns."""
    columns = COMMS_COLUMNS + [PEER_COLUMN] * (PEER_COLUMN in run.comms.columns)
    comms = run.comms.loc[in_steps(run.comms, steps), columns]
    spans = run.spans.loc[in_steps(run.spans, steps), SPANS_COLUMNS]
    inferred = inferred_syncs(comms, spans, steps, run.manifest)
    unsure = inferred["ambiguous"].to_numpy(dtype=bool)
    own = _built(run, steps, comms, spans, inferred[~unsure])
    if not unsure.any():
        return own, None
    gaps = inferred[unsure]
    own.ambiguous = pd.DataFrame({
        "rank": gaps["rank"].to_numpy(dtype=np.int64),
        "step": gaps["step"].to_numpy(dtype=np.int64),
        "before": gaps["before"].astype(str).to_numpy(dtype=object),
        "gap_ns": (gaps["t1"] - gaps["t0"]).to_numpy(dtype=np.int64),
    })  # fmt: skip
    return own, _built(run, steps, comms, spans, inferred)


def _built(
    run: RunData,
    steps: pd.DataFrame,
    comms: pd.DataFrame,
    spans: pd.DataFrame,
    inferred: pd.DataFrame,
) -> Timeline:
    """The timeline of `steps` from their records and the synchronisations `inferred` in
    them (untraced.COLUMNS)."""
    notes: list[str] = []
    inferred = inferred[COMMS_COLUMNS]
    if not inferred.empty:
        groups = ", ".join(sorted(set(inferred["group"])))
        per_rank = len(inferred) / inferred["rank"].nunique()
        notes.append(f"{per_rank:.0f} synchronisations a rank of group(s) {groups} inferred "
                     "from ranks resuming together after time in no record (none of their "
                     "collectives is recorded)")  # fmt: skip
        labels = {name: object for name in ("op", "group", "tag")}  # categories lack "dp"
        comms = pd.concat([comms.astype(labels), inferred.astype(labels)])
    recorded_rows = len(comms) - len(inferred)  # the inferred rows come last
    comms = comms.reset_index(drop=True)
    waits = spans[spans["phase"] == schema.Phase.COMM_WAIT.value]
    self_waiting = waits.empty  # profiler traces: a collective's interval is its own wait
    instance = collective_instances(comms, run.manifest)
    sizes = _sizes(run, steps, len(comms))
    arrived = arrivals_with_absent_members(comms, instance, run.manifest, sizes)
    absent_ns = arrived - comms["t0"].to_numpy(dtype=np.int64)
    comms["t0"] = arrived
    recv_rows, send_rows = message_pair_rows(comms, run.manifest)
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool).to_numpy()
    kinds = np.where(instance >= 0, np.where(is_async & ~self_waiting, Kind.LAUNCH, Kind.SYNC),
                     Kind.LOCAL)  # fmt: skip
    recv = (comms["op"] == schema.CollectiveOp.RECV.value).to_numpy(dtype=bool)
    matched_recv = np.zeros(len(comms), dtype=bool)
    matched_recv[recv_rows] = True
    kinds = np.where(recv & matched_recv, Kind.RECV, kinds)
    sends_async = comms["op"].isin(P2P_OPS).to_numpy(dtype=bool) & is_async
    kinds = np.where(sends_async & (kinds == Kind.LOCAL), Kind.LAUNCH, kinds)
    # a blocking send of a matched message waits for its receive as the receive waits for it
    # (gloo's rendezvous): a RECV event too, the receive its `sender`
    matched_send = np.zeros(len(comms), dtype=bool)
    matched_send[send_rows] = True
    kinds = np.where(matched_send & ~is_async & (kinds == Kind.LOCAL), Kind.RECV, kinds)
    # so does a send recorded as asynchronous that held its rank until a late receive came,
    # with nothing else recorded meanwhile and no wait on it (a pipeline's batched isend
    # whose wait nobody recorded): its time was waiting for the receiver, not its own
    held = _held_sends(comms, spans, send_rows, recv_rows) & is_async
    kinds = np.where(held, Kind.RECV, kinds)
    events = _events(steps, comms, kinds, instance, waits)
    source = events["source"].to_numpy()
    padded = np.append(absent_ns, 0)  # source -1 (no comm): the 0 at the end
    events["absent_ns"] = padded[np.where(source >= 0, source, len(absent_ns))]
    # a synchronisation inferred from time in no record: that time was waiting in a gap
    events["inferred"] = events["source"].to_numpy() >= recorded_rows
    ranks, first = np.unique(events["rank"].to_numpy(), return_index=True)
    first = np.append(first, len(events))
    timeline = Timeline(ranks, first, events, notes=notes)
    _local_time(timeline, spans, _previous_step_ends(run.steps, steps, ranks))
    _dependencies(timeline, recv_rows, send_rows)
    return timeline


def _sizes(run: RunData, steps: pd.DataFrame, rows: int) -> np.ndarray | None:
    """The bytes of the analysed comms in `build`'s row order, `rows` of them (the inferred
    ones, last, NaN); None where the records give no sizes."""
    if "bytes" not in run.comms:
        return None
    recorded = run.comms.loc[in_steps(run.comms, steps), "bytes"]
    sizes = pd.to_numeric(recorded, errors="coerce").to_numpy(dtype=np.float64)[:rows]
    return np.concatenate([sizes, np.full(rows - len(sizes), np.nan)])


def _held_sends(
    comms: pd.DataFrame, spans: pd.DataFrame, send_rows: np.ndarray, recv_rows: np.ndarray
) -> np.ndarray:
    """Per comm row, whether it is a send that held its rank: its receive started after it
    and before it ended, it lasted at least MIN_WAITING_GAP_NS, and no other record of the
    rank (a span, a wait, another message) overlaps it by more than WAIT_SLACK_NS."""
    out = np.zeros(len(comms), dtype=bool)
    if not len(send_rows):
        return out
    t0 = comms["t0"].to_numpy(dtype=np.int64)
    t1 = comms["t1"].to_numpy(dtype=np.int64)
    late = (t0[recv_rows] > t0[send_rows]) & (t0[recv_rows] <= t1[send_rows])
    long = t1[send_rows] - t0[send_rows] >= MIN_WAITING_GAP_NS
    candidates = send_rows[late & long]
    if not len(candidates):
        return out
    # every record of the candidates' ranks by start: each candidate's neighbours in that order
    rank = np.concatenate([comms["rank"].to_numpy(dtype=np.int64), spans["rank"].to_numpy()])
    starts = np.concatenate([t0, spans["t0"].to_numpy(dtype=np.int64)])
    ends = np.concatenate([t1, spans["t1"].to_numpy(dtype=np.int64)])
    order = lexicographic(rank, starts)
    rank, starts, ends = rank[order], starts[order], ends[order]
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    at = position[candidates]
    new_rank = np.r_[True, rank[1:] != rank[:-1]]
    # the latest end of the rank's records before each (by start), and the next one's start
    before = np.where(new_rank, np.iinfo(np.int64).min, np.r_[np.iinfo(np.int64).min, ends[:-1]])
    group_start = np.maximum.accumulate(np.where(new_rank, np.arange(len(rank)), 0))
    reach = _running_max_by_group(before, group_start)
    last_of_rank = np.r_[rank[1:] != rank[:-1], True]
    next_start = np.where(last_of_rank, np.iinfo(np.int64).max, np.r_[starts[1:], 0])
    alone = (reach[at] <= t0[candidates] + WAIT_SLACK_NS) & (
        next_start[at] >= t1[candidates] - WAIT_SLACK_NS
    )
    out[candidates[alone]] = True
    return out


def _running_max_by_group(values: np.ndarray, group_start: np.ndarray) -> np.ndarray:
    """The running maximum of `values`, restarted where `group_start` (each element's group's
    first index) changes: the first of a group must hold the group's floor."""
    out = values.copy()
    for lo in np.unique(group_start):
        hi = np.searchsorted(group_start, lo, side="right")
        out[lo:hi] = np.maximum.accumulate(values[lo:hi])
    return out


def _events(
    steps: pd.DataFrame,
    comms: pd.DataFrame,
    kinds: np.ndarray,
    instance: np.ndarray,
    waits: pd.DataFrame,
) -> pd.DataFrame:
    """The events of every rank in the order met: each step's START and END, the comms (of
    `kinds`), the waits; by rank, start, step and the kind's place at one instant, ties in
    that order. Columns rank, step, kind, a_ns, e_ns, instance, group, source (the comms
    row)."""
    none = [np.full(len(steps), -1), np.full(len(steps), -1), None, np.full(len(waits), -1)]
    group_codes, group_names = pd.factorize(comms["group"])  # null: -1, the group ""
    parts = {
        "rank": [steps["rank"], steps["rank"], comms["rank"], waits["rank"]],
        "step": [steps["step"], steps["step"], comms["step"], waits["step"]],
        "kind": [np.full(len(steps), Kind.START), np.full(len(steps), Kind.END), kinds,
                 np.full(len(waits), Kind.WAIT)],
        "a_ns": [steps["t0"], steps["t1"], comms["t0"], waits["t0"]],
        "e_ns": [steps["t0"], steps["t1"], comms["t1"], waits["t1"]],
        "instance": [*none[:2], instance, none[3]],
        "group": [*none[:2], group_codes, none[3]],
        "source": [*none[:2], np.arange(len(comms)), none[3]],
    }  # fmt: skip
    columns = {
        name: np.concatenate([np.asarray(part, dtype=np.int64) for part in pieces])
        for name, pieces in parts.items()
    }
    place = np.array([_SORT_ORDER[k] for k in Kind])[columns["kind"]]
    order = lexicographic(columns["rank"], columns["a_ns"], columns["step"], place)
    events = pd.DataFrame({name: column[order] for name, column in columns.items()})
    labels = np.array(["", *(str(name) for name in group_names)], dtype=object)
    events["group"] = labels[events["group"].to_numpy() + 1]
    return events


def _previous_step_ends(
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


def _local_time(timeline: Timeline, spans: pd.DataFrame, previous_step_end: np.ndarray) -> None:
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
    from_start = launch & (a < previous_end)
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


def _dependencies(timeline: Timeline, recv_rows: np.ndarray, send_rows: np.ndarray) -> None:
    """Members of each collective, transfers, what each wait and receive waits for."""
    ev = timeline.events
    kind = ev["kind"].to_numpy().copy()
    a, e = ev["a_ns"].to_numpy(dtype=np.int64), ev["e_ns"].to_numpy(dtype=np.int64)
    raw = ev["instance"].to_numpy()
    in_instance = np.flatnonzero((raw >= 0) & np.isin(kind, [Kind.SYNC, Kind.LAUNCH]))
    codes, uniques = pd.factorize(raw[in_instance])  # dense ids 0..I-1, in order of first event
    instance = np.full(len(ev), -1, dtype=np.int64)
    instance[in_instance] = codes
    sender = _senders(ev, kind, recv_rows, send_rows)
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
    receives = np.flatnonzero((kind == Kind.RECV) & (sender >= 0))
    receives = receives[kind[sender[receives]] == Kind.LAUNCH]
    held = e[sender[receives]] + WAIT_SLACK_NS >= a[receives]
    launched_sends = sender[receives[held]]
    # its transfer: from the moment both sides were there to its own end
    both_there = np.maximum(a[launched_sends], a[receives[held]])
    transfer[launched_sends] = np.maximum(e[launched_sends] - both_there, 0)
    awaitable = np.zeros(len(ev), dtype=np.bool_)
    awaitable[in_instance] = True
    awaitable[launched_sends] = True
    count, awaited, by_arrival, post = for_size(_awaited_launches, len(ev))(
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


def _awaited_launches(kind, awaitable, a, e, ready, first, slack_ns, min_wait_ns):  # fmt: skip
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
