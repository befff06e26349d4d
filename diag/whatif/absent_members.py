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
    comms: pd.DataFrame,
    instance: np.ndarray,
    manifest: schema.Manifest,
    sizes: np.ndarray | None = None,
) -> np.ndarray:
    """Each comm row's arrival (t0), later for the collectives of groups with untraced
    members, by the time they waited for those members (see the module's text); `sizes`:
    each row's bytes (NaN: unknown), collectives of different sizes being apart."""
    t0 = comms["t0"].to_numpy(dtype=np.int64).copy()
    if comms.empty:
        return t0
    traced = set(np.unique(comms["rank"].to_numpy(dtype=np.int64)).tolist())
    partial_groups: dict[str, set[int]] = {}  # axis -> the traced ranks of partly traced groups
    for axis, groups in manifest.groups.items():
        for members in groups:
            mine = traced.intersection(members)
            if mine and len(mine) < len(members):
                partial_groups.setdefault(axis, set()).update(mine)
    if not partial_groups:
        return t0
    groups = comms["group"].astype(object).to_numpy()
    ranks = comms["rank"].to_numpy(dtype=np.int64)
    ops = comms["op"].astype(object).to_numpy()
    alone = (instance < 0) & ~np.isin(ops, list(P2P_OPS))
    pairs = zip(groups, ranks, strict=True)
    alone &= np.array([r in partial_groups.get(str(g), ()) for g, r in pairs], dtype=bool)
    if not alone.any():
        return t0
    rows = np.flatnonzero(alone)
    t1 = comms["t1"].to_numpy(dtype=np.int64)
    if sizes is None:
        sizes = np.full(len(comms), np.nan)
    table = pd.DataFrame({
        "rank": ranks[rows], "group": groups[rows].astype(str), "op": ops[rows].astype(str),
        "bytes": np.asarray(sizes, dtype=np.float64)[rows],
        "length": np.maximum(t1[rows] - t0[rows], 0),
    })  # fmt: skip
    keys = ["rank", "group", "op", "bytes"]
    transfer = table.groupby(keys, dropna=False)["length"].transform("min").to_numpy()
    t0[rows] = t1[rows] - transfer
    return t0
