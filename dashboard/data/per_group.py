"""Values per rank and the statistics over the ranks of each group: the grid of a heatmap (a
value per group and step) and the median and maximum of a group's bars."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dashboard.data.runs import LoadedRun
from diag.contract import schema

RANK_METRICS = {
    "busy": ("busy_s", "busy"),
    "exposed": ("exposed_comm_s", "exposed comm"),
    "idle": ("idle_s", "idle"),
    "wall": ("wall_s", "step wall"),
}
"""The per-rank times a heatmap or group chart can show, by key: (column, name)."""
WAIT_METRICS = {
    "skew": ("skew_s", "arrival skew"),
    "transfer": ("transfer_s", "transfer"),
}
"""The waiting a heatmap or group chart can show when the run has an attribution, by key:
(column, name). A rank's waiting in collectives split by the what-if replay
(`RunMetrics.attribution.waits`) into arrival skew (until its group's last member arrived) and
transfer; per rank and communication group, per step over the replayed steps: there is no value
per step, so their heatmap has a column per communication group."""


def rank_metrics(loaded: LoadedRun) -> dict[str, tuple[str, str]]:
    """The metrics the Ranks page offers for this run: RANK_METRICS, and WAIT_METRICS when the
    run has an attribution."""
    ranks = loaded.metrics.ranks
    waits = loaded.metrics.attribution is not None and "skew_s" in ranks
    return {**RANK_METRICS, **(WAIT_METRICS if waits else {})}


@dataclass(frozen=True)
class StepGrid:
    """A value per row (a group, or a rank) and step: the maximum over the row's ranks, the
    median, and the rank that holds the maximum (-1 where the row has no value)."""

    rows: list[str]
    steps: list[Any]  # the columns: steps (int), or communication groups (str) for WAIT_METRICS
    maximum: np.ndarray  # (rows, steps), NaN where no rank of the row has a value
    median: np.ndarray  # (rows, steps)
    top_rank: np.ndarray  # (rows, steps), int64


def step_grid(values: pd.DataFrame, groups: pd.DataFrame, by: str = "step") -> StepGrid:
    """`values` (rank, `by`, value) per row of `groups` (rank_groups) and value of `by`: a
    step, or with `by="comm_group"` a communication group (wait_values)."""
    merged = values.merge(groups, on="rank", how="inner").dropna(subset=["value"])
    rows = groups.drop_duplicates("order")["group"].tolist()
    steps = sorted(merged[by].unique().tolist())
    shape = (len(rows), len(steps))
    if merged.empty:
        empty = np.full(shape, np.nan)
        return StepGrid(rows, steps, empty, empty.copy(), np.full(shape, -1, dtype=np.int64))
    column = pd.Index(steps).get_indexer(merged[by])
    merged = merged.assign(col=column)
    median = merged.groupby(["order", "col"])["value"].median()
    top = merged.sort_values(["value", "rank"], ascending=[False, True], kind="stable")
    top = top.drop_duplicates(["order", "col"])
    grid_max, grid_median = np.full(shape, np.nan), np.full(shape, np.nan)
    grid_rank = np.full(shape, -1, dtype=np.int64)
    order, col = top["order"].to_numpy(), top["col"].to_numpy()
    grid_max[order, col] = top["value"].to_numpy(dtype=float)
    grid_rank[order, col] = top["rank"].to_numpy(dtype=np.int64)
    at = median.index
    grid_median[at.get_level_values(0), at.get_level_values(1)] = median.to_numpy(dtype=float)
    return StepGrid(rows, steps, grid_max, grid_median, grid_rank)


def group_stats(
    values: pd.DataFrame, groups: pd.DataFrame, blamed: Sequence[int] = ()
) -> pd.DataFrame:
    """Per group of `groups`, over its ranks' `values` (rank, value): ranks (how many have a
    value), median, maximum, max_rank (the rank holding it, the lowest on a tie) and blamed
    (whether a blamed rank is in the group), in group order."""
    merged = values.merge(groups, on="rank", how="inner").dropna(subset=["value"])
    top = merged.sort_values(["value", "rank"], ascending=[False, True], kind="stable")
    top = top.drop_duplicates("order").set_index("order")
    by_group = merged.groupby("order")
    named = groups.drop_duplicates("order").set_index("order")["group"]
    stats = pd.DataFrame({
        "group": named,
        "ranks": by_group.size(),
        "median": by_group["value"].median(),
        "maximum": top["value"],
        "max_rank": top["rank"],
        "blamed": groups.assign(b=groups["rank"].isin(list(blamed))).groupby("order")["b"].any(),
    }).dropna(subset=["maximum"])  # fmt: skip
    return stats.astype({"ranks": np.int64, "max_rank": np.int64}).reset_index(drop=True)


def rank_step_values(rank_steps: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank, step and value: a RANK_METRICS time of every rank at every step, in ms."""
    column = RANK_METRICS.get(metric, RANK_METRICS["busy"])[0]
    return pd.DataFrame({
        "rank": rank_steps["rank"], "step": rank_steps["step"],
        "value": 1e3 * rank_steps[column].astype(float),
    })  # fmt: skip


def rank_values(ranks: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank and value: a RANK_METRICS time of every rank per analysed step, or a WAIT_METRICS
    time per replayed step (over all its communication groups), in ms."""
    if metric in WAIT_METRICS:  # already per step
        per_step = 1e3 * pd.to_numeric(ranks[WAIT_METRICS[metric][0]], errors="coerce")
    else:
        column = RANK_METRICS.get(metric, RANK_METRICS["busy"])[0]
        per_step = 1e3 * ranks[column].astype(float) / ranks["steps"].clip(lower=1)
    return pd.DataFrame({"rank": ranks["rank"], "value": per_step})


def wait_values(waits: pd.DataFrame, metric: str) -> pd.DataFrame:
    """rank, comm_group and value: a WAIT_METRICS time of every rank in every communication
    group (`Attribution.waits`), ms per replayed step; for `step_grid(..., by="comm_group")`."""
    column = WAIT_METRICS.get(metric, WAIT_METRICS["skew"])[0]
    return pd.DataFrame({
        "rank": waits["rank"].astype(np.int64), "comm_group": waits["group"].astype(str),
        "value": 1e3 * pd.to_numeric(waits[column], errors="coerce"),
    })  # fmt: skip


def memory_totals(memory_steps: pd.DataFrame) -> pd.DataFrame:
    """rank, step and value: the sum of the measured memory categories of every rank at every
    step (bytes), the last record of each step; a category a step did not sample (activations
    are sampled every few steps) keeps the rank's last sampled value."""
    if memory_steps.empty:
        return pd.DataFrame(columns=["rank", "step", "value"])
    columns = list(schema.MEMORY_CATEGORIES)
    last = memory_steps.groupby(["rank", "step"], sort=True)[columns].last()
    filled = last.groupby(level="rank").ffill()
    total = filled.sum(axis=1, min_count=1)
    return total.rename("value").reset_index()


def memory_peaks(memory_peak: pd.DataFrame) -> pd.DataFrame:
    """rank and value: every rank's peak (`RunMetrics.memory_peak`, bytes)."""
    return pd.DataFrame({"rank": memory_peak["rank"], "value": memory_peak["peak_bytes"]})
