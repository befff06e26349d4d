"""Which records on different ranks are one collective, and which send feeds which receive.

The n-th collective of one op in one group is the same collective on every member rank (they
are issued in the same order, or the job would hang). A point-to-point message
goes between two ranks, its sender and its receiver: the n-th send of a step from rank a to rank
b is the n-th receive of that step on b from a. Who the other side is comes from the data, never
from a tag's text (tags are free: `act`, `forward-send`, none at all in a profiler trace):
- the rank's neighbours in its pipeline group (manifest `groups["pp"]`, a ring): one
  neighbour (two stages) is the peer; between two, the one whose opposite record (a receive
  for a send, a send for a receive) ends nearest the same moment: both sides of a message
  complete together;
- without a pipeline, in a world of two ranks, the other rank;
- where the record names its peer (a profiler trace's `Dst Rank` / `Src Rank`, column `peer`),
  that rank, before any guess: a batch's ops (Megatron's `batch_isend_irecv`: one kernel, its
  ops ending together) name theirs where nothing in time tells the two neighbours apart.
docs/metrics.md ("Dependencies") says more, and where this can go wrong.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.peers import pipeline_peers, tp_stand_ins
from diag.numeric.ordering import dense_key, lexicographic, occurrence

P2P_OPS = frozenset({schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value})


def label_codes(labels: pd.Series) -> tuple[np.ndarray, list[str]]:
    """One integer a distinct label (null is "", code 0) and the labels, as strings."""
    codes, uniques = pd.factorize(labels)
    return codes + 1, ["", *(str(u) for u in uniques)]


def group_member_of(
    manifest: schema.Manifest, group_codes: np.ndarray, group_names: list[str], ranks: np.ndarray
) -> np.ndarray:
    """For each record, which of its axis's groups (manifest.groups) holds its rank; 0 when
    the manifest does not say."""
    member_of = np.zeros(len(ranks), dtype=np.int64)
    for code, name in enumerate(group_names):
        groups = manifest.groups.get(name) or []
        largest = max((max(members) for members in groups if members), default=-1)
        if largest < 0:  # no groups, or only empty ones ({"dp": [[]]})
            continue
        lookup = np.zeros(largest + 1, dtype=np.int64)
        for i, members in enumerate(groups):
            lookup[np.asarray(members, dtype=np.int64)] = i
        mask = group_codes == code
        inside = mask & (ranks < len(lookup))
        member_of[inside] = lookup[ranks[inside]]
    return member_of


def collective_instances(comms: pd.DataFrame, manifest: schema.Manifest) -> np.ndarray:
    """For each row of `comms` (any order), the id of the collective it is one member's part
    of (the same id on every member), or -1 for point-to-point messages and collectives seen
    on one rank only."""
    out = np.full(len(comms), -1, dtype=np.int64)
    if comms.empty:
        return out
    ranks = comms["rank"].to_numpy(dtype=np.int64)
    order = lexicographic(ranks, comms["t0"].to_numpy(dtype=np.int64))
    ranks = ranks[order]
    group_codes, group_names = label_codes(comms["group"].iloc[order])
    op_codes, op_names = label_codes(comms["op"].iloc[order])
    member_of = group_member_of(manifest, group_codes, group_names, ranks)
    stream = (group_codes * (member_of.max() + 1) + member_of) * len(op_names) + op_codes
    n = occurrence(dense_key(ranks, stream))  # the n-th of its rank's stream (rows by start)
    instance = stream * (int(n.max()) + 1) + n
    is_p2p = np.isin(np.asarray(op_names, dtype=object), list(P2P_OPS))[op_codes]
    ids = pd.factorize(instance)[0]
    instance[(np.bincount(ids)[ids] < 2) | is_p2p] = -1
    out[order] = instance
    return out


def message_pairs(comms: pd.DataFrame, manifest: schema.Manifest) -> dict[int, int]:
    """For each receive (row position in `comms`), the position of the send it waits for."""
    receives, sends = message_pair_rows(comms, manifest)
    return dict(zip(receives.tolist(), sends.tolist(), strict=True))


def message_pair_rows(
    comms: pd.DataFrame, manifest: schema.Manifest
) -> tuple[np.ndarray, np.ndarray]:
    """The row positions in `comms` of each receive and of the send it waits for (two arrays
    of equal length, receives in the order of their start)."""
    empty = np.zeros(0, dtype=np.int64)
    rows, send = _point_to_point(comms)
    if not len(rows):
        return empty, empty
    peer = _neighbour_peers(comms, rows, send, manifest)
    keep = peer >= 0
    rows, send, peer = rows[keep], send[keep], peer[keep]
    rank = comms["rank"].to_numpy(dtype=np.int64)[rows]
    step = comms["step"].to_numpy(dtype=np.int64)[rows]
    t0 = comms["t0"].to_numpy(dtype=np.int64)[rows]
    by_start = lexicographic(rank, t0)
    rows, send, rank = rows[by_start], send[by_start], rank[by_start]
    peer, step = peer[by_start], step[by_start]
    source, target = np.where(send, rank, peer), np.where(send, peer, rank)
    n = occurrence(dense_key(send, step, source, target))  # the n-th, by start, of its link
    # the n-th message of a step on a link: its receive, then its send, side by side
    by_message = lexicographic(step, source, target, n, send)
    key = np.stack([step, source, target, n])[:, by_message]
    is_send = send[by_message]
    pair = (key[:, 1:] == key[:, :-1]).all(axis=0) & ~is_send[:-1] & is_send[1:]
    sender = np.full(len(rows), -1)
    sender[by_message[:-1][pair]] = by_message[1:][pair]
    receives = np.flatnonzero(sender >= 0)  # in the order of their start
    return rows[receives], rows[sender[receives]]


def message_peers(comms: pd.DataFrame, manifest: schema.Manifest) -> tuple[np.ndarray, np.ndarray]:
    """The row positions of the point-to-point records in `comms` and, for each, the other
    side's global rank (-1 where it cannot be told)."""
    rows, send = _point_to_point(comms)
    if not len(rows):
        return rows, rows.copy()
    return rows, _neighbour_peers(comms, rows, send, manifest)


def _point_to_point(comms: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The row positions of the sends and receives in `comms`, and which of them are sends."""
    if comms.empty:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    op_codes, op_names = label_codes(comms["op"])
    ops = np.asarray(op_names, dtype=object)
    rows = np.flatnonzero(np.isin(ops, list(P2P_OPS))[op_codes])
    return rows, (ops == schema.CollectiveOp.SEND.value)[op_codes[rows]]


def _neighbour_peers(
    comms: pd.DataFrame, rows: np.ndarray, send: np.ndarray, manifest: schema.Manifest
) -> np.ndarray:
    """For the point-to-point records at `rows` (`send`: which are sends), the neighbour of
    their rank that is the other side: the only one, or of two the one whose opposite records
    end nearest in time; -1 where the rank has none."""
    rank = comms["rank"].to_numpy(dtype=np.int64)[rows]
    named = _named_peers(comms, rows)
    size = max(int(rank.max()) + 1, 2)
    before, after = np.full(size, -1, dtype=np.int64), np.full(size, -1, dtype=np.int64)
    for r, (previous, following) in pipeline_peers(manifest).items():
        if r < size:
            before[r], after[r] = previous, following
    if not (after >= 0).any() and manifest.world_size == 2:  # no pipeline known: the other rank
        before[:2], after[:2] = [1, 0], [1, 0]
    previous, following = before[rank], after[rank]
    peer = np.where(named >= 0, named, np.where(previous == following, previous, -1))
    ambiguous = np.flatnonzero(
        (named < 0) & (previous >= 0) & (following >= 0) & (previous != following)
    )
    if len(ambiguous):
        t1 = comms["t1"].to_numpy(dtype=np.int64)[rows]
        recorded = np.unique(comms["rank"].to_numpy(dtype=np.int64))
        largest = max(size, int(previous.max()), int(following.max()), int(recorded[-1])) + 1
        traced = np.zeros(largest, dtype=bool)
        traced[recorded] = True
        # an untraced neighbour's records are its lockstep partner's (its messages' ends)
        read_as = np.arange(largest)
        for untraced, partner in lockstep_stand_ins(comms, manifest).items():
            if untraced < largest:
                read_as[untraced] = partner
        near_previous = _closeness(rank, send, t1, ambiguous, read_as[previous[ambiguous]])
        near_following = _closeness(rank, send, t1, ambiguous, read_as[following[ambiguous]])
        peer[ambiguous] = np.where(
            near_following > near_previous, following[ambiguous], previous[ambiguous]
        )
        step = comms["step"].to_numpy(dtype=np.int64)[rows]
        alternative = np.where(peer == previous, following, previous)[ambiguous]
        margin = _guess_margin(near_previous, near_following, ~traced[read_as[alternative]])
        _balance_links(peer, ambiguous, margin, alternative, rank, step, send, traced)
    return peer


def _guess_margin(
    near_previous: np.ndarray, near_following: np.ndarray, unseen: np.ndarray
) -> np.ndarray:
    """How much nearer in time the guessed neighbour's opposite records looked than the
    other's (the larger, the surer the guess). Where the other neighbour left no records
    (`unseen`: no file of its traces), nothing of it can look near: the guess is as sure as
    the guessed neighbour's record ends near this one's (minus the distance), so a message
    that no record of the traced neighbour ends with is the first to go to the untraced one."""
    with np.errstate(invalid="ignore"):  # two ranks without records: -inf - -inf
        apart = np.abs(np.nan_to_num(near_following - near_previous, nan=0.0, posinf=1e30,
                                     neginf=1e30))  # fmt: skip
    guessed = np.maximum(near_previous, near_following)
    return np.where(unseen & np.isfinite(guessed), guessed, apart)


def _named_peers(comms: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For the records at `rows`, the peer their record names (column `peer`, a global rank
    other than their own), -1 where none is named."""
    out = np.full(len(rows), -1, dtype=np.int64)
    if "peer" not in comms.columns or not len(rows):
        return out
    named = pd.to_numeric(comms["peer"].iloc[rows], errors="coerce").to_numpy(
        dtype=np.float64, na_value=np.nan
    )
    rank = comms["rank"].to_numpy(dtype=np.int64)[rows]
    known = np.isfinite(named) & (named >= 0) & (named != rank)
    out[known] = named[known].astype(np.int64)
    return out


MAX_REPAIR_ROUNDS = 64
"""Rounds of `_balance_links` at most (each flips one guess per rank, step and direction)."""


def _balance_links(
    peer: np.ndarray,
    ambiguous: np.ndarray,
    margin: np.ndarray,
    alternative: np.ndarray,
    rank: np.ndarray,
    step: np.ndarray,
    send: np.ndarray,
    traced: np.ndarray | None = None,
) -> None:
    """Flip the least certain guesses of `peer` (in place) until, in each step, each link
    carries as many sends as receives where a flip can make it so: a send guessed to one
    neighbour while that link has more sends than receives and the other link fewer goes to
    the other; a receive likewise. `alternative[i]` and `margin[i]`: the other neighbour of
    `ambiguous[i]` and how much nearer the guessed one looked. A link to a neighbour that
    left no records (False in `traced`, per rank) shows no count of its own: a guess whose
    link has too many goes to it (a stage between a traced and an untraced neighbour sends
    to both; read as all to the traced one, its messages to the other were paired with the
    wrong receives, and its waiting for the untraced rank went unseen)."""
    other = alternative.copy()
    if traced is None:
        traced = np.ones(int(max(alternative.max(initial=0), rank.max(initial=0))) + 1, bool)
    for _ in range(MAX_REPAIR_ROUNDS):
        source, target = np.where(send, rank, peer), np.where(send, peer, rank)
        links = pd.DataFrame({"step": step, "source": source, "target": target,
                              "surplus": np.where(send, 1, -1)})  # fmt: skip
        surplus = links.groupby(["step", "source", "target"])["surplus"].sum()
        if not surplus.any():
            return
        mine = ambiguous
        now_source = np.where(send[mine], rank[mine], peer[mine])
        now_target = np.where(send[mine], peer[mine], rank[mine])
        new_source = np.where(send[mine], rank[mine], other)
        new_target = np.where(send[mine], other, rank[mine])
        now = surplus.reindex(pd.MultiIndex.from_arrays([step[mine], now_source, now_target]))
        new = surplus.reindex(pd.MultiIndex.from_arrays([step[mine], new_source, new_target]))
        now, new = now.fillna(0).to_numpy(), new.fillna(0).to_numpy()
        # a send leaves a link with too many sends for one with too few; a receive the reverse
        other_unseen = ~traced[other]
        takes = np.where(send[mine], new < 0, new > 0) | other_unseen  # the other: too few
        # a link to a rank with no records counts one side only: nothing to take from it
        wanted = np.where(send[mine], now > 0, now < 0) & takes & traced[peer[mine]]
        if not wanted.any():
            return
        # per rank, step and direction the least certain guess; toward an unseen neighbour
        # as many as the link has too many (nothing on the other side to balance them)
        candidates = pd.DataFrame({"i": np.flatnonzero(wanted), "margin": margin[wanted],
                                   "rank": rank[mine][wanted], "step": step[mine][wanted],
                                   "send": send[mine][wanted],
                                   "up_to": np.where(other_unseen[wanted],
                                                     np.abs(now[wanted]), 1)})  # fmt: skip
        candidates = candidates.sort_values("margin", kind="stable")
        nth = candidates.groupby(["rank", "step", "send"]).cumcount().to_numpy()
        flip = candidates["i"].to_numpy(dtype=np.int64)[nth < candidates["up_to"].to_numpy()]
        records = mine[flip]
        peer[records], other[flip] = other[flip], peer[records]


def _closeness(
    rank: np.ndarray,
    send: np.ndarray,
    t1: np.ndarray,
    which: np.ndarray,
    other: np.ndarray,
) -> np.ndarray:
    """For the records `which`, how closely an opposite record on rank `other` (a receive for
    a send, a send for a receive) ends at the same moment: minus the least distance between
    the two ends (ns); -inf where `other` has none. Both sides of a message complete together
    (a receive when the data is in, a send when it has been taken), whatever either waited."""
    out = np.full(len(which), -np.inf)
    key = rank * 2 + send.astype(np.int64)  # each rank's sends and receives, by end
    order = lexicographic(key, t1)
    sorted_key, sorted_end = key[order], t1[order]
    wanted = other * 2 + (~send[which]).astype(np.int64)
    lo = np.searchsorted(sorted_key, wanted, side="left")
    hi = np.searchsorted(sorted_key, wanted, side="right")
    end = t1[which]
    place = np.zeros(len(which), dtype=np.int64)
    by_wanted = np.argsort(wanted, kind="stable")
    _, firsts = np.unique(wanted[by_wanted], return_index=True)
    for mine in np.split(by_wanted, firsts[1:]):  # one search per (rank, direction)
        a, b = lo[mine[0]], hi[mine[0]]
        place[mine] = a + np.searchsorted(sorted_end[a:b], end[mine])
    for j in (place - 1, place):  # the ends just before and just after
        valid = (j >= lo) & (j < hi)
        distance = np.abs(sorted_end[np.where(valid, j, 0)] - end).astype(np.float64)
        out = np.where(valid, np.maximum(out, -distance), out)
    return out


def lockstep_stand_ins(comms: pd.DataFrame, manifest: schema.Manifest) -> dict[int, int]:
    """Each rank without a single record whose tensor-parallel group has a traced member: that
    member (the lowest; `peers.tp_stand_ins`)."""
    if comms.empty:
        return {}
    return tp_stand_ins(manifest, set(np.unique(comms["rank"].to_numpy(dtype=np.int64)).tolist()))
