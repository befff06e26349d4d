"""Ranks nobody traced, read from the ranks that step with them (issue 39: trace folders with
ranks' files lost).

The members of a tensor-parallel group meet in a collective at every layer, so they run in
lockstep: an untraced rank whose TP group has a traced member ran when that member did
(matching.lockstep_stand_ins, which the matching of messages also reads). Its collectives of
other axes are joined to those its partner took part in at the same place
(`join_stand_ins`), and a receive from it waits for its partner's send at the same place,
or, with no partner, for the message its other pipeline neighbour passed it
(`surrogate_message_rows`). A TP group nobody traced (a lost node's) steps together too
(`untraced_lockstep_groups`). Matching the traced records themselves is matching.py's.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.contract.names import TP
from diag.contract.peers import pipeline_peers, stand_in_links
from diag.numeric.ordering import dense_key, lexicographic, occurrence
from diag.whatif.matching import P2P_OPS, lockstep_stand_ins, message_peers


def surrogate_message_rows(
    comms: pd.DataFrame, manifest: schema.Manifest
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Receives from a rank that left no records, each with a traced send it takes the
    place of:
    - where the untraced rank x has a lockstep stand-in y (`peers.stand_in_links`), the n-th
      receive of a step on rank b from x waits for the n-th send of that step from y to y's
      neighbour on b's side of the pipeline (x sent when y did);
    - else, where x's other neighbour a in the pipeline is traced, it waits for the n-th
      send of the step from a to x (`relayed`): the message x passed on, in the same
      direction (a forward activation or a backward gradient, each micro-batch in order
      at every stage); x's own time between the two is then part of the receive's transfer,
      which late_members.py reads as waiting for x beyond the fastest message of its size.
    Held at its measured length, such a receive carried the untraced rank's lateness into
    every counterfactual: a straggler before it in the pipeline, sped up, still waited for
    the message the untraced rank sent late because of it (a dp2 x tp2 x pp4 job with its
    straggler's next stage's trace lost read the straggler's cost 1.5% of the step, not
    52%). Three arrays of equal length (the receives' rows, the sends' rows, which pairs
    are relayed); the pairing is one-way: the send keeps its own receive."""
    empty = np.zeros(0, dtype=np.int64)
    none = (empty, empty, np.zeros(0, dtype=bool))
    traced = set(np.unique(comms["rank"].to_numpy(dtype=np.int64)).tolist())
    neighbours = pipeline_peers(manifest)
    if not set(neighbours) - traced:  # every rank of the pipeline traced: nothing to stand in
        return none
    rows, peer = message_peers(comms, manifest)
    if not len(rows):
        return none
    send = comms["op"].astype(object).to_numpy()[rows] == schema.CollectiveOp.SEND.value
    rank = comms["rank"].to_numpy(dtype=np.int64)[rows]
    step = comms["step"].to_numpy(dtype=np.int64)[rows]
    t0 = comms["t0"].to_numpy(dtype=np.int64)[rows]
    links = stand_in_links(manifest, traced)
    # the receives from an untraced rank, as the link whose send they wait for
    source = np.full(len(rows), -1, dtype=np.int64)
    target = np.full(len(rows), -1, dtype=np.int64)
    relayed = np.zeros(len(rows), dtype=bool)
    untraced_peer = np.array([int(p) >= 0 and int(p) not in traced for p in peer], dtype=bool)
    # messages per step on each link and way: a relay pairs the n-th of one link with the
    # n-th of the other, so only where the untraced rank passes on as many as it receives
    # (not an interleaved schedule's last stage, whose second chunk's activations go back to
    # the first stage: half of what it receives from the stage before it)
    per_link = Counter(zip(step.tolist(), rank.tolist(), peer.tolist(), send.tolist(), strict=True))
    for i in np.flatnonzero(~send & untraced_peer).tolist():
        x, b = int(peer[i]), int(rank[i])
        if x not in neighbours:
            continue
        side = 0 if neighbours[x][0] == b else 1 if neighbours[x][1] == b else -1
        if side < 0:
            continue
        if (x, b) in links:
            source[i], target[i] = links[(x, b)]
        elif neighbours[x][1 - side] in traced and neighbours[x][0] != neighbours[x][1]:
            # (x's only neighbour, a first or last stage: nothing passed on to read it from)
            a, at_step = neighbours[x][1 - side], int(step[i])
            if per_link[(at_step, a, x, True)] == per_link[(at_step, b, x, False)]:
                source[i], target[i], relayed[i] = a, x, True
    taking = np.flatnonzero(source >= 0)
    sends = np.flatnonzero(send & (peer >= 0))
    if not len(taking) or not len(sends):
        return none
    # the n-th, by start, of each (step, link): the taking receives per receiving rank
    mine = np.concatenate([taking, sends])
    link_source = np.concatenate([source[taking], rank[sends]])
    link_target = np.concatenate([target[taking], peer[sends]])
    receiver = np.concatenate([rank[taking], np.full(len(sends), -1)])
    order = lexicographic(step[mine], link_source, link_target, receiver, t0[mine])
    n = occurrence(dense_key(step[mine][order], link_source[order], link_target[order],
                             receiver[order]))  # fmt: skip
    table = pd.DataFrame({"row": rows[mine][order], "step": step[mine][order],
                          "source": link_source[order], "target": link_target[order],
                          "n": n, "is_send": receiver[order] < 0,
                          "relayed": np.concatenate([relayed[taking], np.zeros(len(sends), bool)])[
                              order]})  # fmt: skip
    keys = ["step", "source", "target", "n"]
    sends_table = table[table["is_send"]]
    joined = table[~table["is_send"]].merge(sends_table, on=keys, suffixes=("", "_send"))
    return (joined["row"].to_numpy(dtype=np.int64), joined["row_send"].to_numpy(dtype=np.int64),
            joined["relayed"].to_numpy(dtype=bool))  # fmt: skip


def _proxy_groups(
    manifest: schema.Manifest, stand: dict[int, int], traced: set[int]
) -> dict[tuple[str, int], tuple[int, ...]]:
    """(axis, traced rank) -> a rank of each other group of that axis whose collectives stand
    for its group's untraced members': where every untraced member of the rank's group has a
    lockstep stand-in (`stand`) that is not the rank itself (one for each group they lie in:
    two members lost, their partners in two groups)."""
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    for axis, members_list in manifest.groups.items():
        where = {int(r): i for i, members in enumerate(members_list) for r in members}
        for members in members_list:
            untraced = [int(m) for m in members if int(m) not in traced]
            proxies = {stand.get(m, -1) for m in untraced}
            if not untraced or -1 in proxies:
                continue
            one_each = {where.get(p): p for p in sorted(proxies, reverse=True)}  # the lowest
            chosen = tuple(sorted(one_each.values()))
            for member in members:
                if int(member) in traced and int(member) not in proxies:
                    out[(str(axis), int(member))] = chosen
    return out


def join_stand_ins(
    comms: pd.DataFrame, manifest: schema.Manifest, instance: np.ndarray, stand_in: np.ndarray
) -> np.ndarray:
    """`instance` with each collective of a group with untraced members joined to the
    collective those members' lockstep stand-ins (`lockstep_stand_ins`: their TP partners,
    in one group of the same axis) took part in at the same place (the n-th of that op in
    their group): an untraced member arrived there when its partner did. A data-parallel
    all-reduce whose member left no trace then completes when that member's TP partner
    reaches its own, and moves with it in every counterfactual; read without it, it was held
    at its measured length (alone: `stand_in` > 0), or its waiting for the member read as
    transfer (two or more traced members). A rank that is its own members' stand-in (one
    traced rank per TP group) is left alone (absent_members.py)."""
    stand = lockstep_stand_ins(comms, manifest)
    if not stand or comms.empty:
        return instance
    rank = comms["rank"].to_numpy(dtype=np.int64)
    groups = comms["group"].astype(object).to_numpy().astype(str)
    ops = comms["op"].astype(object).to_numpy().astype(str)
    proxy_of = _proxy_groups(manifest, stand, set(np.unique(rank).tolist()))
    candidates = np.flatnonzero(((instance >= 0) | (stand_in > 0)) & ~np.isin(ops, list(P2P_OPS)))
    joining, proxy = [], []  # a row once for each rank whose collective stands for its own
    for i in candidates.tolist():
        for one in proxy_of.get((groups[i], int(rank[i])), ()):
            joining.append(i)
            proxy.append(one)
    if not joining:
        return instance
    order = lexicographic(rank, comms["t0"].to_numpy(dtype=np.int64))
    _, group_code = np.unique(groups, return_inverse=True)
    _, op_code = np.unique(ops, return_inverse=True)
    nth = np.empty(len(comms), dtype=np.int64)
    nth[order] = occurrence(dense_key(rank[order], group_code[order], op_code[order]))
    place = pd.DataFrame({"rank": rank, "group": group_code, "op": op_code, "n": nth,
                          "row": np.arange(len(comms))})  # fmt: skip
    wanted = place.iloc[joining].assign(rank=np.asarray(proxy, dtype=np.int64))
    found = wanted.merge(place, on=["rank", "group", "op", "n"], suffixes=("", "_proxy"))
    out = instance.copy()
    fresh = int(instance.max(initial=-1)) + 1
    alone = out < 0
    out[alone] = fresh + np.arange(int(alone.sum()))  # each its own, to be joined
    parent: dict[int, int] = {}

    def root(i: int) -> int:
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    for row, other in zip(found["row"].tolist(), found["row_proxy"].tolist(), strict=True):
        a, b = root(int(out[row])), root(int(out[other]))
        if a != b:
            parent[a] = b
    joined = np.array([root(int(i)) for i in out], dtype=np.int64)
    # a row alone before and joined to nothing stays alone
    counts = pd.Series(joined).value_counts()
    single = alone & (counts.reindex(joined).to_numpy() < 2)
    return np.where(single, -1, joined)


def untraced_lockstep_groups(
    manifest: schema.Manifest, traced: set[int]
) -> dict[int, tuple[int, ...]]:
    """Each rank of a tensor-parallel group with no traced member (a lost node's), with the
    group's ranks: they step together, so they are late together (late_members.py); a group
    with a traced member has it for a stand-in (matching.lockstep_stand_ins)."""
    out: dict[int, tuple[int, ...]] = {}
    for group in manifest.groups.get(TP, []):
        members = tuple(sorted(int(r) for r in group))
        if len(members) > 1 and not traced.intersection(members):
            out.update(dict.fromkeys(members, members))
    return out
