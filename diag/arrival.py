"""Late-arriving ranks: who starts each collective last.

The n-th collective of one op in one group is the same collective on every member rank (they
are issued in the same order, or the job would hang). For each such instance the rank that
starts it last is the one the others wait for; a rank that arrives last most of the time, by
a margin, holds the group back even when its own compute looks normal (host stalls, data
loading, a slow CPU launch path). Times of ranks on different hosts are only as comparable as
their clocks: our collectors align them at a start barrier; profiler traces keep host clocks.
"""

from __future__ import annotations

import pandas as pd

from diag import schema

KEYS = ["rank", "step"]


def _group_index(manifest: schema.Manifest) -> dict[tuple[str, int], int]:
    """(axis, rank) -> which of the axis's groups holds the rank."""
    index: dict[tuple[str, int], int] = {}
    for axis, groups in manifest.groups.items():
        for i, members in enumerate(groups):
            for rank in members:
                index[(axis, int(rank))] = i
    return index


def arrivals(comms: pd.DataFrame, steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    """Per rank: collectives matched with peers, the median lateness behind the first rank to
    start (s), and the share of them it started last."""
    columns = ["rank", "matched", "late_median_s", "last_share"]
    records = comms.merge(steps[KEYS], on=KEYS, how="inner")
    if records.empty or records["rank"].nunique() < 2:
        return pd.DataFrame(columns=columns)
    where = _group_index(manifest)
    records = records.sort_values(["rank", "t0"], kind="stable").assign(
        group=records["group"].fillna("").astype(str),
        op=records["op"].fillna("").astype(str),
    )
    records["member_of"] = [
        where.get((g, int(r)), 0) for g, r in zip(records["group"], records["rank"], strict=True)
    ]
    instance = ["group", "member_of", "op"]
    records["n"] = records.groupby(["rank", *instance]).cumcount()
    by_instance = records.groupby([*instance, "n"])["t0"]
    records["ranks_in"] = by_instance.transform("size")
    records = records[records["ranks_in"] >= 2]
    if records.empty:
        return pd.DataFrame(columns=columns)
    late_ns = records["t0"] - by_instance.transform("min").loc[records.index]
    last = records["t0"] == by_instance.transform("max").loc[records.index]
    table = (
        records.assign(late_s=late_ns / 1e9, last=last)
        .groupby("rank")
        .agg(
            matched=("t0", "size"), late_median_s=("late_s", "median"), last_share=("last", "mean")
        )
        .reset_index()
    )
    return table[columns]
