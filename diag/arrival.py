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
from diag.whatif.matching import group_member_of, label_codes

KEYS = ["rank", "step"]


def arrivals(comms: pd.DataFrame, steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    """Per rank: collectives matched with peers, the median lateness behind the first rank to
    start (s), and the share of them it started last."""
    columns = ["rank", "matched", "late_median_s", "last_share"]
    records = comms.loc[in_steps(comms, steps), ["rank", "op", "group", "t0"]]
    if records.empty or records["rank"].nunique() < 2:
        return pd.DataFrame(columns=columns)
    records = records.sort_values(["rank", "t0"], kind="stable")
    ranks = records["rank"].to_numpy(dtype=np.int64)
    group_codes, group_names = label_codes(records["group"])
    op_codes, op_names = label_codes(records["op"])
    member_of = group_member_of(manifest, group_codes, group_names, ranks)
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
