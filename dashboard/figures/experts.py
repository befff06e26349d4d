"""The Experts page's figures: tokens per expert per step, and the drop rate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from dashboard.figures.base import apply_layout


def expert_heatmap(layer: int, steps: Sequence[int], tokens: np.ndarray) -> go.Figure:
    """Tokens routed to each expert (columns) at each step (rows) of one MoE layer."""
    fig = go.Figure(
        go.Heatmap(
            z=tokens,
            x=[f"e{e}" for e in range(tokens.shape[1])],
            y=list(steps),
            colorscale="Viridis",
            colorbar={"title": "tokens"},
            hovertemplate="step %{y}, expert %{x}: %{z:.0f} tokens<extra></extra>",
        )
    )
    fig = apply_layout(fig, f"MoE layer {layer}: tokens per expert per step")
    fig.update_yaxes(title="step", autorange="reversed")
    fig.update_xaxes(title="expert", type="category")
    return fig


def drop_rate_over_steps(
    layers: Sequence[tuple[int, Sequence[int], Sequence[float | None]]],
) -> go.Figure:
    """Per MoE layer, dropped over routed assignments at each step."""
    fig = go.Figure([
        go.Scatter(x=list(steps), y=list(rates), name=f"layer {layer}", mode="lines+markers")
        for layer, steps, rates in layers
    ])  # fmt: skip
    fig = apply_layout(fig, "drop rate per step (dropped / routed)")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(title="step")
    return fig
