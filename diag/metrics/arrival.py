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

from diag.contract import schema
from diag.metrics import NS_PER_S, in_steps
from diag.numeric.ordering import dense_key, group_medians, occurrence
from diag.whatif.matching import P2P_OPS, group_member_of, label_codes

KEYS = ["rank", "step"]
COLUMNS = ["rank", "matched", "late_median_s", "last_share"]


def arrivals(comms: pd.DataFrame, steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    """Per rank: collectives matched with peers, the median lateness behind the first rank to
    start (s), and the share of them it started last."""
    records = comms.loc[in_steps(comms, steps), ["rank", "step", "op", "group", "t0"]]
    # a message is matched with its other side by peer (whatif/matching.py), never as the n-th
    # send of every rank: that pairs sends of different stages and reads clock-sized lateness
    records = records[~records["op"].isin(list(P2P_OPS))]
    # an unknown layout: no group says which ranks' collectives are one
    if records.empty or records["rank"].nunique() < 2 or manifest.layout_unknown:
        return pd.DataFrame(columns=COLUMNS)
    ranks = records["rank"].to_numpy(dtype=np.int64)
    t0 = records["t0"].to_numpy(dtype=np.int64)
    instance = _instances(records, ranks, t0, manifest)
    size = np.bincount(instance)
    first = np.full(len(size), np.iinfo(np.int64).max, dtype=np.int64)
    latest = np.full(len(size), np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, instance, t0)
    np.maximum.at(latest, instance, t0)
    kept = size[instance] >= 2
    if not kept.any():
        return pd.DataFrame(columns=COLUMNS)
    return _per_rank(ranks[kept], (t0 - first[instance])[kept], (t0 == latest[instance])[kept])


def _instances(
    records: pd.DataFrame, ranks: np.ndarray, t0: np.ndarray, manifest: schema.Manifest
) -> np.ndarray:
    """Per record, a dense id of the collective it is one member's part of: the n-th record,
    by start, of a rank in one step on one (group, member_of, op) stream. Counted per step, so
    that one collective a rank's trace lacks (launched before the profiler started) cannot
    shift every later match and read a clock-sized lateness."""
    group_codes, group_names = label_codes(records["group"])
    op_codes, op_names = label_codes(records["op"])
    member_of = group_member_of(manifest, group_codes, group_names, ranks)
    # one integer per (group, member_of, op): the collective's stream on that group
    stream = (group_codes * (member_of.max() + 1) + member_of) * len(op_names) + op_codes
    step = records["step"].to_numpy(dtype=np.int64)
    n = occurrence(dense_key(ranks, step, stream), t0)
    return pd.factorize(dense_key(stream, step, n))[0]


def _per_rank(ranks: np.ndarray, late_ns: np.ndarray, last: np.ndarray) -> pd.DataFrame:
    """The table of `arrivals` from the matched records (any order): a rank's lateness
    behind the first to start each collective, and whether it was the last."""
    table_ranks, late_median_s = group_medians(ranks, late_ns, NS_PER_S)
    lo = int(table_ranks[0])
    matched = np.bincount(ranks - lo)[table_ranks - lo]
    last_count = np.bincount(ranks - lo, weights=last)[table_ranks - lo]
    return pd.DataFrame({
        "rank": table_ranks,
        "matched": matched.astype(np.int64),
        "late_median_s": late_median_s,
        "last_share": last_count / matched,
    })  # fmt: skip
