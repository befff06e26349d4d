"""Pipeline metrics: each rank's stage, its measured bubble, and the stage imbalance.

Pure functions over the loaded tables and the per-rank table of `diag.metrics` (docs/metrics.md,
"Pipeline"). A rank's bubble is the share of its step wall time lost to the pipeline,
1 - stage_work / wall, where the stage's work is its compute, its blocking collectives in
other groups (a TP all-reduce inside a layer belongs to the micro-batch's time, as in the
schedule's theory) and its comm_wait spans (the DP all-reduce after the flush: COM003's
business, not the schedule's): waiting in a blocking receive for a neighbour, and idling, are
the bubble the theory (p-1)/(v·m+p-1) (`ledger.bubble_fraction`) predicts.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from diag.contract import schema
from diag.read.roles import rank_stages

STAGE_COLUMNS = ["stage", "ranks", "busy_per_step_s", "bubble_frac"]


def with_stages(
    ranks: pd.DataFrame, spans: pd.DataFrame, manifest: schema.Manifest
) -> pd.DataFrame:
    """The per-rank table with `stage` and `bubble_frac` = 1 - stage_work_s / wall_s (null if
    pp = 1)."""
    out = ranks.copy()
    if (manifest.layout.pp or 1) <= 1 or out.empty:
        out["stage"] = pd.Series([None] * len(out), index=out.index, dtype=object)
        out["bubble_frac"] = pd.Series([None] * len(out), index=out.index, dtype=object)
        return out
    stages = rank_stages(spans, manifest)
    out["stage"] = [stages.get(int(r)) for r in out["rank"]]
    out["bubble_frac"] = 1 - out["stage_work_s"] / out["wall_s"].where(out["wall_s"] > 0)
    return out


def stage_table(ranks: pd.DataFrame) -> pd.DataFrame:
    """One row per stage: how many ranks hold it, their mean compute per step, and the stage's
    bubble (1 - summed stage work / summed wall over its ranks). Empty without stages."""
    if "stage" not in ranks or ranks["stage"].isna().all():
        return pd.DataFrame(columns=STAGE_COLUMNS)
    staged = ranks[ranks["stage"].notna() & (ranks["steps"] > 0)].copy()
    staged["stage"] = staged["stage"].astype("int64")
    staged["busy_per_step_s"] = staged["busy_s"] / staged["steps"]
    by_stage = staged.groupby("stage", sort=True)
    wall = by_stage["wall_s"].sum()
    table = pd.DataFrame({
        "stage": wall.index.astype("int64"),
        "ranks": by_stage.size().to_numpy(),
        "busy_per_step_s": by_stage["busy_per_step_s"].mean().to_numpy(),
        "bubble_frac": (1 - by_stage["stage_work_s"].sum() / wall.where(wall > 0)).to_numpy(),
    })  # fmt: skip
    return table[STAGE_COLUMNS]


def pipeline_summary(ranks: pd.DataFrame) -> dict[str, Any]:
    """`bubble_fraction` (mean over stages of the stage bubble) and `stage_imbalance` (max over
    mean of the stages' compute per step); None when there is nothing to measure."""
    stages = stage_table(ranks)
    bubble = stages["bubble_frac"].dropna()
    busy = stages["busy_per_step_s"]
    mean_busy = float(busy.mean()) if len(busy) else 0.0
    return {
        "bubble_fraction": float(bubble.mean()) if len(bubble) else None,
        "stage_imbalance": float(busy.max()) / mean_busy if mean_busy > 0 else None,
    }
