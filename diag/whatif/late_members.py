"""Waiting, inside collectives the traced members share and messages to peers nobody traced,
for the members nobody traced.

A trace folder often lacks some ranks' files (a node's traces lost, a rank that wrote none).
Where two or more members of a group were traced, their collectives are matched as usual
(diag/whatif/matching.py) and each member's time from the last *traced* arrival to its end
reads as transfer. But the collective ends only once every member has arrived: where an
untraced member came later, that part is waiting for it, and read as transfer it made a
late rank with no trace look like a slow network (a dp=8 job with its straggler's trace
removed read "communication not hidden, 32% of the step" and named nobody).

What bounds the transfer is size: a message is not carried faster than a larger one of the
same op among groups of the same axis (a fully traced group of that axis, or a collective of
the same group that waited for nobody). So each collective's transfer is at most the shortest
that any collective of the axis and op with at least its bytes took from its last traced
arrival to its end; the time beyond that bound (and beyond a slack for the transfer's own
variation) is waiting for the untraced members. It is a lower bound of their lateness, read
only where the sizes are recorded (GPU traces, run directories): without sizes a small
collective's time would bound a large one's, and nothing is inferred. The groups of an axis
are taken to have links alike (the same span of hosts), as a regular layout gives them.

Where no collective bounds them (one group of the axis, late in every collective alike) the
data cannot tell transfer from waiting: those collectives are flagged `unsure`, and what
their transfer is said to cost is a range whose low end reads them as waiting.

A send or receive whose peer left no records is matched to nothing and held at its measured
length; a GPU's send or receive kernel runs until its peer's is there, so the part of it
beyond the fastest matched message of the axis with at least its bytes is waiting for that
peer (a pipeline whose last stage's traces are lost: the stage before it waits in every
message to it). The peer is the one the record names, else the neighbour in the pipeline
the message went to (diag/whatif/matching.py: of two, the traced one where a record of it
ends with this one, the untraced one where none does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.whatif.absent_members import (
    ARRIVED_LAST_SLACK_NS,
    ARRIVED_LAST_SLACK_SHARE,
    waited_for_members,
)
from diag.whatif.lockstep import untraced_lockstep_groups
from diag.whatif.matching import P2P_OPS, message_peers
from diag.whatif.timeline_model import Kind


@dataclass(frozen=True)
class LateMembers:
    """Per timeline event, the waiting for untraced members inside its transfer (`late_ns`,
    0 elsewhere) and which members (`code`: an index into `members`, -1 elsewhere)."""

    late_ns: np.ndarray
    code: np.ndarray
    members: list[tuple[int, ...]]
    unsure: np.ndarray
    """Per event: a collective of a group with untraced members whose transfer may be all
    waiting for them (no faster collective bounds it)."""
    local_ns: np.ndarray
    """Per event: the waiting for an untraced peer inside an unmatched send's or receive's
    own time (a LOCAL event's, held as measured by the replay), 0 elsewhere."""


def untraced_in_groups(
    manifest: schema.Manifest, traced: set[int], at_least: int = 2
) -> dict[tuple[str, int], tuple[int, ...]]:
    """(group label, traced rank) -> the members of that rank's group nobody traced, for the
    groups (manifest.groups) with at least `at_least` traced members and some untraced: with
    two, the groups whose collectives are matched though incomplete (with one, its traced
    member stands in for the others: absent_members.py)."""
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    for axis, groups in manifest.groups.items():
        for members in groups:
            mine = traced.intersection(members)
            if len(mine) >= at_least and len(mine) < len(set(members)):
                missing = tuple(sorted(set(members) - traced))
                for rank in mine:
                    out[(str(axis), rank)] = missing
    return out


def late_members(
    events: pd.DataFrame,
    comms: pd.DataFrame,
    sizes: np.ndarray | None,
    manifest: schema.Manifest,
    traced: set[int],
) -> LateMembers:
    """The `LateMembers` of a timeline's `events` (kind, instance, group, rank, transfer_ns,
    a_ns, e_ns, source, stand_in); `comms` (op, and peer where recorded) and `sizes` (bytes,
    NaN unknown) per comms row (`source`)."""
    n = len(events)
    if n == 0 or not traced:
        return _none(n)
    if sizes is None:
        sizes = np.full(len(comms), np.nan)
    ops = comms["op"].astype(object).to_numpy()
    late_ns, keys, unsure = _in_collectives(events, ops, sizes, manifest, traced)
    local_ns, relay_ns, message_keys = _in_messages(events, comms, sizes, manifest, traced)
    late_ns = np.where(relay_ns > 0, relay_ns, late_ns)
    for i, key in message_keys.items():
        keys.setdefault(i, key)
    alone = untraced_in_groups(manifest, traced, at_least=1)
    source = events["source"].to_numpy(dtype=np.int64)
    group = events["group"].astype(str).to_numpy()
    rank = events["rank"].to_numpy(dtype=np.int64)
    # an asynchronous collective whose rank is its group's only traced member: its waiting
    # for the others is in its transfer (absent_members.lone_launches)
    if "lone" in events:
        lone = _lone_waits(events, ops, sizes)
        transfer = events["transfer_ns"].to_numpy(dtype=np.float64)
        for i in np.flatnonzero(waited_for_members(lone, transfer - lone)).tolist():
            theirs = alone.get((str(group[i]), int(rank[i])))
            if theirs is not None:
                late_ns[i], keys[i] = lone[i], theirs
    waited = np.flatnonzero((late_ns > 0) | (local_ns > 0)).tolist()
    late_sets = {keys[i] for i in waited if i in keys}
    # a rank standing in for untraced members of another group (its only traced member)
    # waited for the same members there: where they are members found late here, their
    # lateness is in its local time (`absent_ns`), and their being on time removes it too
    for i in np.flatnonzero((events["stand_in"].to_numpy() > 0) & (source >= 0)).tolist():
        theirs = alone.get((str(group[i]), int(rank[i])))
        if theirs in late_sets:
            keys.setdefault(i, theirs)
    # a tensor-parallel group nobody traced steps together (every layer's collective): its
    # members are late together, each waited for in the messages and collectives of its own
    # pipeline and data-parallel groups; one set, so that their being on time is read at once
    units = untraced_lockstep_groups(manifest, traced)
    keys = {i: _with_lockstep(key, units) for i, key in keys.items()}
    members = sorted(set(keys.values()))
    index = {m: k for k, m in enumerate(members)}
    code = np.full(n, -1, dtype=np.int64)
    for i, key in keys.items():
        code[i] = index[key]
    return LateMembers(late_ns, code, members, unsure, local_ns)


def _lone_waits(events: pd.DataFrame, ops: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per event, the waiting inside an asynchronous collective whose rank is its group's
    only traced member (absent_members.lone_launches: its length less the shortest its rank
    took for the same op, group and size), at least its length less the most its transfer
    can take, read from the collectives of the axis and op matched across traced members
    (`_transfer_bound`): where the untraced member is late in every step (a straggler), each
    of the rank's own collectives waited for it and none gives the transfer."""
    lone_ns = events["lone_wait_ns"].to_numpy(dtype=np.float64)
    lone = events["lone"].to_numpy(dtype=bool)
    if not lone.any():
        return lone_ns
    source = events["source"].to_numpy(dtype=np.int64)
    instance = events["instance"].to_numpy(dtype=np.int64)
    kind = events["kind"].to_numpy()
    row = np.where(source >= 0, source, 0)
    size = np.where(source >= 0, np.asarray(sizes, dtype=np.float64)[row], np.nan)
    sized = np.isfinite(size) & (size > 0)
    transfer = events["transfer_ns"].to_numpy(dtype=np.float64)
    matched = (instance >= 0) & np.isin(kind, [Kind.SYNC, Kind.LAUNCH]) & ~lone
    chosen = np.flatnonzero((matched | lone) & sized & (source >= 0))
    table = pd.DataFrame({
        "group": events["group"].astype(str).to_numpy()[chosen],
        "op": ops[source[chosen]], "bytes": size[chosen],
        "transfer": np.where(lone[chosen], np.inf, transfer[chosen]),
    })  # fmt: skip
    bound = _transfer_bound(table)
    beyond = np.where(np.isfinite(bound), transfer[chosen] - bound, 0.0)
    out = lone_ns.copy()
    out[chosen] = np.where(lone[chosen], np.maximum(lone_ns[chosen], beyond), out[chosen])
    return out


def _with_lockstep(key: tuple[int, ...], units: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
    """A set of untraced members with the rest of their untraced tensor-parallel groups."""
    if not any(r in units for r in key):
        return key
    return tuple(sorted({*key, *(m for r in key for m in units.get(r, ()))}))


def _none(n: int) -> LateMembers:
    zero = np.zeros(n)
    return LateMembers(zero, np.full(n, -1, dtype=np.int64), [], np.zeros(n, bool), zero.copy())


def _in_collectives(
    events: pd.DataFrame,
    ops: np.ndarray,
    sizes: np.ndarray,
    manifest: schema.Manifest,
    traced: set[int],
) -> tuple[np.ndarray, dict[int, tuple[int, ...]], np.ndarray]:
    """Matched collectives of incomplete groups: per event the waiting inside its transfer,
    the untraced members it was for (event -> members), and whether no faster collective
    bounds it (`unsure`)."""
    n = len(events)
    late_ns, unsure = np.zeros(n), np.zeros(n, dtype=bool)
    missing = untraced_in_groups(manifest, traced)
    if not missing:
        return late_ns, {}, unsure
    source = events["source"].to_numpy(dtype=np.int64)
    kind = events["kind"].to_numpy()
    rank = events["rank"].to_numpy(dtype=np.int64)
    group = events["group"].astype(str).to_numpy()
    matched = (events["instance"].to_numpy() >= 0) & np.isin(kind, [Kind.SYNC, Kind.LAUNCH])
    candidates = np.flatnonzero(matched & (source >= 0))
    size = np.asarray(sizes, dtype=np.float64)[source[candidates]]
    pairs = zip(group[candidates], rank[candidates], strict=True)
    found = [missing.get((g, int(r))) for g, r in pairs]
    incomplete = np.array([k is not None for k in found], dtype=bool)
    sized = np.isfinite(size) & (size > 0)
    # the reference: every sized matched collective of the axes with untraced members
    axes = {g for g, _ in missing}
    reference = sized & np.isin(group[candidates], list(axes))
    rows = candidates[reference]
    transfer = events["transfer_ns"].to_numpy(dtype=np.float64)[rows]
    table = pd.DataFrame({
        "group": group[rows], "op": ops[source[rows]], "bytes": size[reference],
        "transfer": transfer,
    })  # fmt: skip
    bound = _transfer_bound(table)
    slack = np.maximum(ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE * bound)
    waited = np.where(transfer - bound > slack, transfer - bound, 0.0)
    mine = incomplete[reference]
    late_ns[rows[mine]] = waited[mine]
    # unsure: the collectives of incomplete groups that no collective of a complete group
    # of the axis bounds (with at least their bytes): the bound itself may be waiting
    unsure[candidates[incomplete & ~sized]] = True
    complete = table.assign(transfer=np.where(mine, np.inf, transfer))
    unsure[rows[mine]] = ~np.isfinite(_transfer_bound(complete)[mine])
    keys = {int(i): k for i, k in zip(candidates, found, strict=True) if k is not None}
    return late_ns, keys, unsure


def _in_messages(
    events: pd.DataFrame,
    comms: pd.DataFrame,
    sizes: np.ndarray,
    manifest: schema.Manifest,
    traced: set[int],
) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[int, ...]]]:
    """Sends and receives whose peer (as the record names it, else the pipeline neighbour
    matching.message_peers reads from the times) left no records: unmatched,
    their own time is held as measured (LOCAL), and a GPU's send or receive kernel runs until
    its peer's is there. Per event the part of that time beyond the fastest matched message of
    the axis with at least its bytes (waiting for the peer); the same of a relayed receive's
    transfer (lockstep.surrogate_message_rows: from the send the untraced rank passed on, its
    time in between included); and the peer set: every untraced peer of the axis, as a
    pipeline's stage is all its ranks (event -> members)."""
    n = len(events)
    local_ns, relay_ns = np.zeros(n), np.zeros(n)
    world = int(manifest.world_size)
    source = events["source"].to_numpy(dtype=np.int64)
    kind = events["kind"].to_numpy()
    ops = comms["op"].astype(object).to_numpy()
    if len(traced) >= world:  # no rank without records: no message waited for one
        return local_ns, relay_ns, {}
    rows, guessed = message_peers(comms, manifest)  # named, else the pipeline neighbour
    if not len(rows):
        return local_ns, relay_ns, {}
    peers = np.full(len(comms), np.nan)
    peers[rows] = np.where(guessed >= 0, guessed, np.nan)
    has_row = source >= 0
    row = np.where(has_row, source, 0)
    p2p = has_row & np.isin(ops[row], list(P2P_OPS))
    peer = np.where(p2p, peers[row], np.nan)
    untraced_peer = np.array(
        [bool(np.isfinite(p)) and 0 <= int(p) < world and int(p) not in traced for p in peer],
        dtype=bool,
    )
    relayed = (
        (events["relayed"].to_numpy(dtype=bool) if "relayed" in events else np.zeros(n, bool))
        & p2p
        & untraced_peer
    )
    held = p2p & (kind == Kind.LOCAL) & untraced_peer
    waiting = held | relayed
    if not waiting.any():
        return local_ns, relay_ns, {}
    size = np.asarray(sizes, dtype=np.float64)[row]
    group = events["group"].astype(str).to_numpy()
    # the reference: matched messages (a receive's, a launched send's transfer) of the axis
    matched = p2p & np.isin(kind, [Kind.RECV, Kind.LAUNCH]) & (events["sender"].to_numpy() >= 0)
    sized = np.isfinite(size) & (size > 0)
    reference = np.flatnonzero((matched | waiting) & sized)
    own = (events["e_ns"] - events["a_ns"]).to_numpy(dtype=np.float64)
    transfer = events["transfer_ns"].to_numpy(dtype=np.float64)
    table = pd.DataFrame({
        "group": group[reference], "op": "message", "bytes": size[reference],
        "transfer": np.where(waiting[reference], np.inf, transfer[reference]),
    })  # fmt: skip
    bound = _transfer_bound(table)
    slack = np.maximum(ARRIVED_LAST_SLACK_NS, ARRIVED_LAST_SLACK_SHARE * bound)
    # a held message waited within its own time; a relayed receive within its transfer
    # (from the relayed send's arrival: the untraced rank's time in between)
    late = np.where(relayed[reference], transfer[reference], own[reference]) - bound
    wanted = waiting[reference] & np.isfinite(bound) & (late > slack)
    into = np.where(relayed[reference[wanted]], 1, 0)
    local_ns[reference[wanted][into == 0]] = late[wanted][into == 0]
    relay_ns[reference[wanted][into == 1]] = late[wanted][into == 1]
    by_axis: dict[str, set[int]] = {}
    for i in np.flatnonzero(waiting):
        by_axis.setdefault(str(group[i]), set()).add(int(peer[i]))
    keys = {int(i): tuple(sorted(by_axis[str(group[i])])) for i in np.flatnonzero(waiting)}
    return local_ns, relay_ns, keys


def _transfer_bound(table: pd.DataFrame) -> np.ndarray:
    """Per row (group, op, bytes, transfer), the most its transfer can take: the least, over
    the rows of its group label (axis) and op, of their transfer times the ratio of its bytes
    to theirs where that is above 1. A collective's transfer is a latency plus its bytes over
    the link's bandwidth, so a larger one's transfer bounds it, and a smaller one's scaled by
    the ratio does too (its latency counted that many times): a rank whose collective is
    the axis's largest (a first stage's gradients, with the embedding) is bounded by the
    smaller ones; bounded by larger ones alone, it was not, and its waiting for an untraced
    member read 1 ms of 149 (dp2 x pp4, the straggler's first stage lost)."""
    if table.empty:
        return np.zeros(0)
    by_size = table.groupby(["group", "op", "bytes"], sort=True)["transfer"].min().reset_index()
    # within each (axis, op), from the largest size down: the running minimum
    frame = by_size.iloc[::-1].copy()
    frame["above"] = frame.groupby(["group", "op"], sort=False)["transfer"].cummin()
    # from the smallest up: the least time per byte so far, times the row's bytes
    frame = frame.iloc[::-1]
    per_byte = frame["transfer"] / frame["bytes"]
    frame["below"] = per_byte.groupby([frame["group"], frame["op"]], sort=False).cummin()
    frame["bound"] = np.minimum(frame["above"], frame["below"] * frame["bytes"])
    bounds = frame.set_index(["group", "op", "bytes"])["bound"]
    keys = pd.MultiIndex.from_frame(table[["group", "op", "bytes"]])
    return bounds.reindex(keys).to_numpy(dtype=np.float64)
