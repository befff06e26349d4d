"""Memory per rank: the maximum over steps of each field, and the one peak of diag (the step
whose six categories sum highest), docs/metrics.md "Memory"."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.metrics.common import rank_step_order
from diag.numeric.ordering import run_starts

MEMORY_FIELDS = (*schema.MEMORY_CATEGORIES, "device_peak", "host_rss")


def memory_maxima(memory: pd.DataFrame) -> pd.DataFrame:
    fields = list(MEMORY_FIELDS)
    floats = all(memory[name].dtype == np.float64 for name in fields if name in memory)
    ranks = memory["rank"].to_numpy()
    if len(ranks) and floats and (ranks[1:] >= ranks[:-1]).all():  # a rank's rows together
        starts = run_starts(ranks)
        highest = {name: np.fmax.reduceat(memory[name].to_numpy(), starts) for name in fields}
        return pd.DataFrame({"rank": ranks[starts], **highest})  # (fmax: NaN only if all are)
    table = memory.groupby("rank")[fields].max()
    return table.reset_index()[["rank", *MEMORY_FIELDS]]


def memory_peak(memory: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the step whose six memory categories sum highest (the first such step on a
    tie) and that sum: `rank, step, peak_bytes`."""
    columns = ["rank", "step", "peak_bytes"]
    if memory.empty:
        return pd.DataFrame(columns=columns)
    total = memory[list(schema.MEMORY_CATEGORIES)].astype("float64").fillna(0.0).sum(axis=1)
    order = rank_step_order(memory)  # a rank's rows together, by step
    ranks, steps = memory["rank"].to_numpy()[order], memory["step"].to_numpy()[order]
    sums = total.to_numpy()[order]
    if np.isnan(sums).any():  # (inf - inf): as idxmax skips it
        frame = pd.DataFrame({"rank": ranks, "step": steps, "peak_bytes": sums})
        first_highest = frame.groupby("rank", sort=True)["peak_bytes"].idxmax()
        return frame.loc[first_highest, columns].reset_index(drop=True)
    starts = run_starts(ranks)
    sizes = np.diff(np.r_[starts, len(ranks)])
    highest = np.flatnonzero(sums == np.repeat(np.maximum.reduceat(sums, starts), sizes))
    group = np.repeat(np.arange(len(starts)), sizes)[highest]
    first = highest[np.r_[True, group[1:] != group[:-1]]]  # each rank's first highest step
    return pd.DataFrame({"rank": ranks[first], "step": steps[first], "peak_bytes": sums[first]})
