"""Late-arriving ranks: who starts each collective last.

The n-th collective of one op in one group is the same collective on every member rank (they
are issued in the same order, or the job would hang). For each such instance the rank that
starts it last is the one the others wait for; a rank that arrives last most of the time, by
a margin, holds the group back even when its own compute looks normal (host stalls, data
loading, a slow CPU launch path). Times of ranks on different hosts are only as comparable as
their clocks: our collectors align them at a start barrier; profiler traces keep host clocks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import schema
from diag.metrics import in_steps

KEYS = ["rank", "step"]


def _member_of(
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


def _codes(labels: pd.Series) -> tuple[np.ndarray, list[str]]:
    """One integer a distinct label (null is "", code 0) and the labels, as strings."""
    codes, uniques = pd.factorize(labels)
    return codes + 1, ["", *(str(u) for u in uniques)]


def arrivals(comms: pd.DataFrame, steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    """Per rank: collectives matched with peers, the median lateness behind the first rank to
    start (s), and the share of them it started last."""
    columns = ["rank", "matched", "late_median_s", "last_share"]
    records = comms.loc[in_steps(comms, steps), ["rank", "op", "group", "t0"]]
    if records.empty or records["rank"].nunique() < 2:
        return pd.DataFrame(columns=columns)
    records = records.sort_values(["rank", "t0"], kind="stable")
    ranks = records["rank"].to_numpy(dtype=np.int64)
    group_codes, group_names = _codes(records["group"])
    op_codes, op_names = _codes(records["op"])
    member_of = _member_of(manifest, group_codes, group_names, ranks)
    # one integer per (group, member_of, op): the collective's stream on that group
    stream = (group_codes * (member_of.max() + 1) + member_of) * len(op_names) + op_codes
    frame = pd.DataFrame({"rank": ranks, "stream": stream, "t0": records["t0"].to_numpy()})
    n = frame.groupby(["rank", "stream"], sort=False).cumcount().to_numpy()
    frame["instance"] = stream * (int(n.max()) + 1) + n
    by_instance = frame.groupby("instance", sort=False)["t0"]
    size = by_instance.transform("size").to_numpy()
    first = by_instance.transform("min").to_numpy()
    latest = by_instance.transform("max").to_numpy()
    kept = size >= 2
    if not kept.any():
        return pd.DataFrame(columns=columns)
    t0 = frame["t0"].to_numpy()
    matched = pd.DataFrame({
        "rank": ranks[kept],
        "late_s": (t0[kept] - first[kept]) / 1e9,
        "last": t0[kept] == latest[kept],
    })  # fmt: skip
    table = (
        matched.groupby("rank")
        .agg(
            matched=("late_s", "size"),
            late_median_s=("late_s", "median"),
            last_share=("last", "mean"),
        )
        .reset_index()
    )
    return table[columns]
