"""Which records on different ranks are one collective, and which send feeds which receive.

The n-th collective of one op in one group is the same collective on every member rank (they
are issued in the same order, or the job would hang). Point-to-point messages of a pipeline
follow its ring: the n-th `act` send of rank a is the n-th `act` receive of the next rank of its
pipeline group, the n-th `grad` send the n-th `grad` receive of the previous one (the tags of
the reference trainers and the simulator, docs/run-format.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import schema
from diag.ordering import dense_key, lexicographic, occurrence

P2P_OPS = frozenset({schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value})
FORWARD_TAG = "act"
"""A pipeline message travelling to the next stage (activations); others go to the previous."""


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


def pipeline_peers(manifest: schema.Manifest) -> dict[int, tuple[int, int]]:
    """Each rank's (previous, next) rank in its pipeline group, as a ring; empty without one."""
    peers: dict[int, tuple[int, int]] = {}
    for members in manifest.groups.get("pp", []):
        size = len(members)
        for i, rank in enumerate(members):
            if size > 1:
                peers[int(rank)] = (int(members[(i - 1) % size]), int(members[(i + 1) % size]))
    return peers


def message_pairs(comms: pd.DataFrame, manifest: schema.Manifest) -> dict[int, int]:
    """For each receive (row position in `comms`), the position of the send it waits for."""
    receives, sends = message_pair_rows(comms, manifest)
    return dict(zip(receives.tolist(), sends.tolist(), strict=True))


def message_pair_rows(
    comms: pd.DataFrame, manifest: schema.Manifest
) -> tuple[np.ndarray, np.ndarray]:
    """The row positions in `comms` of each receive and of the send it waits for (two arrays
    of equal length): the n-th message of a (sender, receiver, tag) is the n-th receive of it."""
    empty = np.zeros(0, dtype=np.int64)
    peers = pipeline_peers(manifest)
    if comms.empty or not peers:
        return empty, empty
    op_codes, op_names = label_codes(comms["op"])
    ops = np.asarray(op_names, dtype=object)
    rows = np.flatnonzero(np.isin(ops, list(P2P_OPS))[op_codes])
    if not len(rows):
        return empty, empty
    rank = comms["rank"].to_numpy(dtype=np.int64)[rows]
    size = max(max(peers), int(rank.max())) + 1
    previous, following = np.full(size, -1, dtype=np.int64), np.full(size, -1, dtype=np.int64)
    for r, (before, after) in peers.items():
        previous[r], following[r] = before, after
    tag_codes, tag_names = label_codes(comms["tag"])
    tag = tag_codes[rows]
    forward = (np.asarray(tag_names, dtype=object) == FORWARD_TAG)[tag]
    send = (ops == schema.CollectiveOp.SEND.value)[op_codes[rows]]
    # a send goes to the next stage (activations) or the previous one; a receive comes from them
    peer = np.where(forward == send, following[rank], previous[rank])
    t0 = comms["t0"].to_numpy(dtype=np.int64)[rows]
    keep = np.flatnonzero(previous[rank] >= 0)
    by_start = keep[lexicographic(rank[keep], t0[keep])]
    rows, send, tag = rows[by_start], send[by_start], tag[by_start]
    rank, peer = rank[by_start], peer[by_start]
    source, target = np.where(send, rank, peer), np.where(send, peer, rank)
    n = occurrence(dense_key(send, source, target, tag))  # the n-th, by start, of its kind
    # the n-th message of a (source, target, tag): its receive, then its send, side by side
    by_message = lexicographic(source, target, tag, n, send)
    key = np.stack([source, target, tag, n])[:, by_message]
    is_send = send[by_message]
    pair = (key[:, 1:] == key[:, :-1]).all(axis=0) & ~is_send[:-1] & is_send[1:]
    sender = np.full(len(rows), -1)
    sender[by_message[:-1][pair]] = by_message[1:][pair]
    receives = np.flatnonzero(sender >= 0)  # in the order of their start, as before
    return rows[receives], rows[sender[receives]]
