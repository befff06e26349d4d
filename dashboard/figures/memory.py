"""The Memory page's figures: the categories per rank, and one rank's over the steps."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import MIB, apply_layout, budget_line, rank_labels
from diag import schema

CATEGORY_COLORS = dict(
    zip(
        schema.MEMORY_CATEGORIES,
        ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#9D9D9D"),
        strict=True,
    )
)


def memory_by_rank(
    memory: pd.DataFrame,
    budget_bytes: float | None = None,
    title: str = "memory per rank by category (MiB, at each rank's peak step)",
) -> go.Figure:
    """Per rank, the six categories of `memory` (MiB, stacked; a rank's categories at its peak
    step stack up to its peak, `data.memory_at_peak`); a category null everywhere left out."""
    labels = rank_labels(memory["rank"])
    fig = go.Figure()
    for category in schema.MEMORY_CATEGORIES:
        if memory[category].notna().any():
            fig.add_trace(
                go.Bar(
                    x=labels, y=memory[category] / MIB, name=category,
                    marker_color=CATEGORY_COLORS[category],
                )
            )  # fmt: skip
    budget_line(fig, budget_bytes)
    fig = apply_layout(fig, title, barmode="stack")
    fig.update_yaxes(title="MiB")
    return fig


def memory_over_steps(
    per_step: pd.DataFrame, rank: int, budget_bytes: float | None = None
) -> go.Figure:
    """One rank's six categories per step (MiB, stacked areas)."""
    fig = go.Figure()
    for category in schema.MEMORY_CATEGORIES:
        if per_step[category].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=per_step["step"], y=per_step[category] / MIB, name=category,
                    stackgroup="memory", mode="lines",
                    line={"color": CATEGORY_COLORS[category]},
                )
            )  # fmt: skip
    budget_line(fig, budget_bytes)
    fig = apply_layout(fig, f"memory of rank {rank} over steps (MiB)")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="MiB")
    return fig
