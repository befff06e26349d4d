"""Memory per rank: the maximum over steps of each field, and the one peak of diag (the step
whose six categories sum highest), docs/metrics.md "Memory"."""

from __future__ import annotations

import pandas as pd

from diag.contract import schema

MEMORY_FIELDS = (*schema.MEMORY_CATEGORIES, "device_peak", "host_rss")


def memory_maxima(memory: pd.DataFrame) -> pd.DataFrame:
    table = memory.groupby("rank")[list(MEMORY_FIELDS)].max()
    return table.reset_index()[["rank", *MEMORY_FIELDS]]


def memory_peak(memory: pd.DataFrame) -> pd.DataFrame:
    """Per rank, the step whose six memory categories sum highest (the first such step on a
    tie) and that sum: `rank, step, peak_bytes`."""
    columns = ["rank", "step", "peak_bytes"]
    if memory.empty:
        return pd.DataFrame(columns=columns)
    total = memory[list(schema.MEMORY_CATEGORIES)].astype("float64").fillna(0.0).sum(axis=1)
    frame = pd.DataFrame({"rank": memory["rank"], "step": memory["step"], "peak_bytes": total})
    frame = frame.sort_values(["rank", "step"], kind="stable")
    first_highest = frame.groupby("rank", sort=True)["peak_bytes"].idxmax()
    return frame.loc[first_highest, columns].reset_index(drop=True)
