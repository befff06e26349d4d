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
        groups = manifest.groups.get(name)
        if not groups:
            continue
        lookup = np.zeros(max(max(m) for m in groups if m) + 1, dtype=np.int64)
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
    order = np.lexsort((comms["t0"].to_numpy(), comms["rank"].to_numpy()))
    frame = comms.iloc[order]
    ranks = frame["rank"].to_numpy(dtype=np.int64)
    group_codes, group_names = label_codes(frame["group"])
    op_codes, op_names = label_codes(frame["op"])
    member_of = group_member_of(manifest, group_codes, group_names, ranks)
    stream = (group_codes * (member_of.max() + 1) + member_of) * len(op_names) + op_codes
    n = pd.DataFrame({"rank": ranks, "stream": stream}).groupby(
        ["rank", "stream"], sort=False
    ).cumcount().to_numpy()  # fmt: skip
    instance = stream * (int(n.max()) + 1) + n
    is_p2p = np.isin(np.asarray(op_names, dtype=object)[op_codes], list(P2P_OPS))
    size = pd.Series(instance).groupby(instance).transform("size").to_numpy()
    instance[(size < 2) | is_p2p] = -1
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
    peers = pipeline_peers(manifest)
    if comms.empty or not peers:
        return {}
    p2p = comms[comms["op"].astype(object).isin(list(P2P_OPS))]
    sends: dict[tuple[int, int, str], list[int]] = {}
    recvs: dict[tuple[int, int, str], list[int]] = {}
    positions = {label: i for i, label in enumerate(comms.index)}
    for label, row in p2p.sort_values(["rank", "t0"], kind="stable").iterrows():
        rank = int(row["rank"])
        if rank not in peers:
            continue
        forward = str(row["tag"]) == FORWARD_TAG
        previous, following = peers[rank]
        tag = str(row["tag"])
        if row["op"] == schema.CollectiveOp.SEND.value:
            sends.setdefault((rank, following if forward else previous, tag), []).append(
                positions[label]
            )
        else:
            recvs.setdefault((previous if forward else following, rank, tag), []).append(
                positions[label]
            )
    pairs: dict[int, int] = {}
    for key, receives in recvs.items():
        for recv, send in zip(receives, sends.get(key, []), strict=False):
            pairs[recv] = send
    return pairs
