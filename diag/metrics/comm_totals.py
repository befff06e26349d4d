"""Collectives summed per (rank, step, op, group, tag, group size): what every metric and rule
that counts bytes, calls or time needs, at a size that does not grow with the number of calls.

A large run's loader workers sum their ranks' collectives into this table and keep the records
themselves only for a window of steps (`RunData.span_steps`); a small run's is summed here from
every record. The sums are of integers (bytes, nanoseconds, counts), so they are exact in any
order: both ways give the same numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.load import RunData
from diag.metrics.common import analysed_steps
from diag.metrics.time_breakdown import time_breakdown

TOTAL_KEYS = ["rank", "step", "op", "group", "tag", "group_size"]
TOTAL_COLUMNS = [
    *TOTAL_KEYS, "count", "bytes", "measured", "expected_bytes", "expected", "duration_ns",
]  # fmt: skip
"""count: calls; bytes: their summed payload (0 when none says); measured: calls that say
their bytes (profiler traces of gloo or DeepEP may not); expected_bytes and expected: the same
for the ledger's bytes; duration_ns: summed t1 - t0."""


def comm_totals(comms: pd.DataFrame) -> pd.DataFrame:
    """The collectives of `comms` summed per TOTAL_KEYS (null keys kept as their own group)."""
    if comms.empty:
        return pd.DataFrame({name: pd.Series(dtype=_dtype(name)) for name in TOTAL_COLUMNS})
    frame = pd.DataFrame({
        **{key: comms[key] for key in TOTAL_KEYS},
        "bytes": comms["bytes"],
        "measured": comms["bytes"].notna(),
        "expected_bytes": comms["expected_bytes"],
        "expected": comms["expected_bytes"].notna(),
        "duration_ns": comms["t1"] - comms["t0"],
    })  # fmt: skip
    totals = frame.groupby(TOTAL_KEYS, dropna=False, observed=True, sort=False).agg(
        count=("measured", "size"),
        bytes=("bytes", "sum"),
        measured=("measured", "sum"),
        expected_bytes=("expected_bytes", "sum"),
        expected=("expected", "sum"),
        duration_ns=("duration_ns", "sum"),
    )
    return totals.reset_index()[TOTAL_COLUMNS]


def step_breakdown(
    steps: pd.DataFrame, spans: pd.DataFrame, comms: pd.DataFrame, warmup: bool = True
) -> dict[str, pd.DataFrame]:
    """What a large run's loader workers reduce some ranks' records to (`diag.load.Breakdown`):
    the `rank_steps` time breakdown and the `comm_totals`, each (rank, step) on its own, so
    the loader may reduce the run a few ranks at a time and concatenate."""
    return {
        "rank_steps": time_breakdown(spans, comms, analysed_steps(steps, warmup)[0]),
        "comm_totals": comm_totals(comms),
    }


def run_comm_totals(run: RunData) -> pd.DataFrame:
    """The run's collective totals: the loader's (a large run's workers summed them), else
    summed now from its records and kept on the run for the next caller."""
    if run.comm_totals is None:
        run.comm_totals = comm_totals(run.comms)
    return run.comm_totals


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The median of `values` each repeated `weights` times (nulls left out), as the median of
    the repeated values would be: the middle one, or the mean of the middle two."""
    known = ~np.isnan(values) & (weights > 0)
    values, weights = values[known], weights[known]
    total = int(weights.sum())
    if total == 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(weights[order])
    low = values[np.searchsorted(ends, (total - 1) // 2, side="right")]
    high = values[np.searchsorted(ends, total // 2, side="right")]
    return float((low + high) / 2)


def _dtype(name: str) -> str:
    if name in ("rank", "step", "count", "measured", "expected", "duration_ns"):
        return "int64"
    return "float64" if name in ("bytes", "expected_bytes", "group_size") else "object"
