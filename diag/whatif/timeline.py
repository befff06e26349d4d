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

The `Timeline` and its event kinds are in timeline_model.py, the local time before each event
in local_time.py, what each event waits for in event_dependencies.py.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.numeric.keys import in_steps
from diag.numeric.ordering import lexicographic
from diag.read.load import RunData
from diag.whatif.absent_members import arrivals_with_absent_members, lone_launches, stand_ins
from diag.whatif.event_dependencies import (  # noqa: F401 (re-exported: the timeline's names)
    GAP_END_TOLERANCE_NS,
    GAP_END_TOLERANCE_SHARE,
    LAUNCH_KIND,
    WAIT_KIND,
    dependencies,
)
from diag.whatif.event_dependencies import awaited_launches as _awaited_launches  # noqa: F401
from diag.whatif.late_members import late_members
from diag.whatif.local_time import (  # noqa: F401 (re-exported: the timeline's names)
    COMPUTE_PHASES,
    HOST_PHASES,
    LAUNCH_PLACES,
    local_time,
    previous_step_ends,
)
from diag.whatif.lockstep import join_stand_ins, surrogate_message_rows
from diag.whatif.matching import P2P_OPS, collective_instances, message_pair_rows
from diag.whatif.timeline_model import MIN_WAITING_GAP_NS, WAIT_SLACK_NS, Kind, Timeline
from diag.whatif.untraced import inferred_syncs

_SORT_ORDER = {Kind.START: 0, Kind.LAUNCH: 1, Kind.SYNC: 2, Kind.RECV: 2, Kind.LOCAL: 2,
               Kind.WAIT: 3, Kind.END: 4}  # fmt: skip
"""At one instant (and within one step: a step ends before the next starts): a step starts first
and ends last; a launch comes before the wait on it."""


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
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool).to_numpy()
    launched = is_async & ~self_waiting & ~comms["op"].isin(P2P_OPS).to_numpy(dtype=bool)
    instance, stand_in, lone, lone_wait_ns = _untraced_members_read(
        comms, run.manifest, instance, sizes, launched
    )
    arrived = arrivals_with_absent_members(comms, stand_in, sizes)
    absent_ns = arrived - comms["t0"].to_numpy(dtype=np.int64)
    comms["t0"] = arrived
    recv_rows, send_rows = message_pair_rows(comms, run.manifest)
    stood_rows, stand_in_sends, relayed = surrogate_message_rows(comms, run.manifest)
    kinds = np.where(instance >= 0, np.where(is_async & ~self_waiting, Kind.LAUNCH, Kind.SYNC),
                     Kind.LOCAL)  # fmt: skip
    recv = (comms["op"] == schema.CollectiveOp.RECV.value).to_numpy(dtype=bool)
    matched_recv = np.zeros(len(comms), dtype=bool)
    matched_recv[recv_rows] = True
    matched_recv[stood_rows] = True
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
    at = np.where(source >= 0, source, len(comms))  # source -1 (no comm): the value appended
    events["absent_ns"] = np.append(absent_ns, 0)[at]
    events["stand_in"] = np.append(stand_in, 0.0)[at]
    events["lone"] = np.append(lone, False)[at]
    events["lone_wait_ns"] = np.append(lone_wait_ns, 0.0)[at]
    relayed_row = np.zeros(len(comms) + 1, dtype=bool)
    relayed_row[stood_rows[relayed]] = True
    events["relayed"] = relayed_row[at]
    # a synchronisation inferred from time in no record: that time was waiting in a gap
    events["inferred"] = events["source"].to_numpy() >= recorded_rows
    ranks, first = np.unique(events["rank"].to_numpy(), return_index=True)
    first = np.append(first, len(events))
    timeline = Timeline(ranks, first, events, notes=notes)
    local_time(timeline, spans, previous_step_ends(run.steps, steps, ranks))
    dependencies(timeline, recv_rows, send_rows, (stood_rows, stand_in_sends))
    traced = set(np.unique(comms["rank"].to_numpy(dtype=np.int64)[:recorded_rows]).tolist())
    late = late_members(timeline.events, comms, sizes, run.manifest, traced)
    timeline.events["late_members_ns"] = late.late_ns
    timeline.events["late_members_local_ns"] = late.local_ns
    timeline.events["late_members"] = late.code
    timeline.events["late_members_unsure"] = late.unsure
    timeline.late_members = late.members
    return timeline


def _untraced_members_read(
    comms: pd.DataFrame,
    manifest: schema.Manifest,
    instance: np.ndarray,
    sizes: np.ndarray | None,
    launched: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """How the collectives of groups with untraced members are read (instance, stand_in,
    lone, lone_wait_ns per comms row): joined to their lockstep stand-ins' where those were
    traced (lockstep.join_stand_ins); else a rank alone in its group stands for the others
    (absent_members.stand_ins: its blocking ones read as arriving when their transfer
    began), and an asynchronous one of those is its own collective, its waiting for them in
    its transfer (`lone`, absent_members.lone_launches)."""
    stand_in = stand_ins(comms, instance, manifest)
    instance = join_stand_ins(comms, manifest, instance, stand_in)
    stand_in = np.where(instance >= 0, 0.0, stand_in)
    lone, lone_wait_ns = lone_launches(comms, instance, stand_in, launched, sizes)
    instance = np.where(lone, int(instance.max(initial=-1)) + 1 + np.arange(len(comms)), instance)
    stand_in = np.where(lone, 0.0, stand_in)  # their waiting is in the transfer, not before
    return instance, stand_in, lone, lone_wait_ns


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
