"""The run's headline: step time, throughput, communication shares, imbalance, the pipeline
bubble against theory, steps and ranks analysed, the last loss, model FLOPs utilisation
(docs/metrics.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from diag.contract import ledger
from diag.metrics import flops, pipeline
from diag.metrics.common import NS_PER_S, rank_step_order, ratio
from diag.read.load import RunData


def summary(
    run: RunData, steps: pd.DataFrame, ranks: pd.DataFrame, warmup_steps: int
) -> dict[str, Any]:
    layout = run.manifest.layout
    tp, pp = layout.tp or 1, layout.pp or 1
    per_step = steps.groupby("step").agg(t0=("t0", "min"), t1=("t1", "max"))
    step_walls_s = (per_step["t1"] - per_step["t0"]) / NS_PER_S
    total_wall_s = float(step_walls_s.sum())
    tokens = steps["tokens"].sum(min_count=1)
    wall_sum = ranks["wall_s"].sum()
    busy_mean = ranks["busy_s"].mean()
    pipeline_metrics = pipeline.pipeline_summary(ranks)
    # the step each rank measures, its own start to end (what a timer in its loop shows); the
    # job-wide step runs from the first rank's start to the last rank's end, later by the
    # ranks' skew at the step's edges
    rank_walls_s = (steps["t1"] - steps["t0"]) / NS_PER_S
    rank_step_s = float(rank_walls_s.mean()) if len(rank_walls_s) else None
    summary: dict[str, Any] = {
        # the mean: what tokens/s, the replay's measured step and every cost share are of
        "step_time_s": float(step_walls_s.mean()) if len(step_walls_s) else None,
        "job_step_time_s": float(step_walls_s.mean()) if len(step_walls_s) else None,
        "rank_step_time_s": rank_step_s,
        "tokens_per_s_rank_step": (
            float(tokens) / (tp * pp) / (rank_step_s * len(step_walls_s))
            if pd.notna(tokens) and rank_step_s and len(step_walls_s)
            else None
        ),
        "step_time_median_s": float(step_walls_s.median()) if len(step_walls_s) else None,
        "tokens_per_s": (
            float(tokens) / (tp * pp) / total_wall_s
            if pd.notna(tokens) and total_wall_s > 0
            else None
        ),
        "comm_share": ratio(ranks["comm_s"].sum(), wall_sum),
        "exposed_comm_share": ratio(ranks["exposed_comm_s"].sum(), wall_sum),
        "hidden_comm_share": _hidden(ranks),
        "busy_imbalance": ratio(ranks["busy_s"].max(), busy_mean),
        "bubble_theory": (
            ledger.bubble_fraction(pp, layout.microbatches or 1, layout.virtual_stages or 1)
            if pp > 1 and run.manifest.schedule_known  # traces say no micro-batch count
            else None
        ),
        "bubble_fraction": pipeline_metrics["bubble_fraction"] if pp > 1 else None,
        "steps_analysed": int(per_step.shape[0]),
        "first_step_analysed": int(per_step.index.min()) if len(per_step) else None,
        "last_step_analysed": int(per_step.index.max()) if len(per_step) else None,
        "ranks_analysed": int(ranks.shape[0]),
        "world_size": run.manifest.world_size,
        "warmup_steps_excluded": warmup_steps,
        "loss_last": _last_loss(steps),
    }
    if pp > 1:  # pipeline runs only (docs/metrics.md, "Pipeline")
        summary["stage_imbalance"] = pipeline_metrics["stage_imbalance"]
    peak_tflops, peak_note = flops.device_peak_tflops(run.manifest.ranks)
    summary.update(
        flops.mfu_summary(
            run.manifest.model, summary["tokens_per_s"], run.manifest.world_size, peak_tflops,
            peak_note,
        )
    )  # fmt: skip
    return summary


def _hidden(ranks: pd.DataFrame) -> float | None:
    """Share of the time collectives are in flight that overlaps compute (not exposed)."""
    comm_s = ranks["comm_s"].sum()
    hidden = ratio(comm_s - ranks["exposed_comm_s"].sum(), comm_s)
    return None if hidden is None else min(max(hidden, 0.0), 1.0)


def _last_loss(steps: pd.DataFrame) -> float | None:
    finite = steps.loc[np.isfinite(steps["loss"]), ["rank", "step", "loss"]]
    if finite.empty:
        return None
    order = rank_step_order(finite)  # each rank's last finite loss: the last of its rows
    ranks, losses = finite["rank"].to_numpy()[order], finite["loss"].to_numpy()[order]
    last = pd.Series(losses[np.r_[ranks[1:] != ranks[:-1], True]])
    return float(last.mean())
