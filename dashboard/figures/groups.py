"""Figures of groups of ranks, for the pages that group them (Timeline, Ranks, Memory): a
heatmap of a value per group and step, and bars of a value per group."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.data import StepGrid
from dashboard.figures.base import BLAME_COLOR, apply_layout, budget_line, plain


def step_heatmap(
    grid: StepGrid,
    title: str,
    unit: str = "ms",
    blamed_rows: Sequence[str] = (),
    scale: float = 1.0,
    colorscale: str = "Viridis",
    columns: str = "step",
) -> go.Figure:
    """One row per group (or rank) of `grid`, one column per step (or what `columns` names:
    "communication group"), coloured by the maximum over the row's ranks (a straggler is not
    averaged away); the hover adds the median and the rank holding the maximum. Values are
    divided by `scale` (bytes to MiB); rows in `blamed_rows` are labelled with a `!`. The data
    goes once, as typed arrays."""
    blamed = set(blamed_rows)
    labels = [plain(f"{row} !" if row in blamed else row) for row in grid.rows]
    maximum = (grid.maximum / scale).astype(np.float32)
    custom = np.dstack([grid.median / scale, grid.top_rank]).astype(np.float32)
    named = any(isinstance(c, str) for c in grid.steps)
    fig = go.Figure(
        go.Heatmap(
            z=maximum,
            x=[plain(c) for c in grid.steps] if named else list(grid.steps),
            y=labels,
            customdata=custom,
            colorscale=colorscale,
            colorbar={"title": plain(unit)},
            hoverongaps=False,
            hovertemplate=f"%{{y}}, {plain(columns)} %{{x}}<br>max %{{z:.1f}} {plain(unit)} "
            f"(rank %{{customdata[1]:.0f}})<br>median %{{customdata[0]:.1f}} {plain(unit)}"
            "<extra></extra>",
        )
    )
    height = int(min(900, max(320, 14 * len(labels) + 140)))  # rows of 14 px, then thinner
    fig = apply_layout(fig, title, height=height)
    fig.update_yaxes(type="category", autorange="reversed", title=None)
    fig.update_xaxes(title=plain(columns), type="category" if named else "-")
    return fig


def group_bars(
    stats: pd.DataFrame,
    title: str,
    unit: str = "ms",
    scale: float = 1.0,
    budget_bytes: float | None = None,
) -> go.Figure:
    """Per group (dashboard.data.group_stats): a bar at the median of its ranks and a marker at
    its maximum, the hover naming the rank that holds it; groups holding a blamed rank have a
    `!` and a red marker, which names the rank. Clicking a group selects it."""
    labels = (stats["group"].astype(str) + np.where(stats["blamed"], " !", "")).map(plain)
    max_rank = stats["max_rank"].astype("int64")
    color = np.where(stats["blamed"], BLAME_COLOR, "#222222")
    fig = go.Figure([
        go.Bar(
            x=labels, y=stats["median"] / scale, name="median rank", marker_color="#4C78A8",
            customdata=stats["ranks"],
            hovertemplate=f"%{{x}}: median %{{y:.1f}} {plain(unit)} over %{{customdata}} ranks"
            "<extra></extra>",
        ),
        go.Scatter(
            x=labels, y=stats["maximum"] / scale, name="max rank", mode="markers+text",
            marker={"color": color, "size": 9, "symbol": "diamond"},
            text=("rank " + max_rank.astype(str)).where(stats["blamed"], ""),
            textposition="top center", customdata=max_rank,
            hovertemplate=f"%{{x}}: max %{{y:.1f}} {plain(unit)} on rank %{{customdata}}"
            "<extra></extra>",
        ),
    ])  # fmt: skip
    budget_line(fig, budget_bytes)
    fig = apply_layout(fig, title, bargap=0.15)
    # many groups: upright labels would collide and plotly's slanted ones overlap in their
    # boxes, so they stand vertical (each as wide as a line of text)
    fig.update_xaxes(type="category", tickangle=-90 if len(stats) > UPRIGHT_GROUPS_MAX else 0)
    fig.update_yaxes(title=plain(unit), rangemode="tozero")
    return fig


UPRIGHT_GROUPS_MAX = 8
"""Up to this many groups the group bars' labels are upright."""
