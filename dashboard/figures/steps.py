"""The step time over the analysed steps (Overview, HTML report): per rank the wall time of each
step, the median over the ranks, the min-max band where there are too many ranks to draw, the
blamed ranks' own lines, and the steps the findings refer to (an onset band, a trend line), so
that a trend or an onset finding can be checked by eye."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.data.step_times import StepMarks, StepTimes
from dashboard.figures.base import apply_layout, plain, rank_color, rank_label, step_axis

MS_PER_S = 1e3
MEDIAN_COLOR = "#222222"
BAND_COLOR = "rgba(76, 120, 168, 0.28)"
ONSET_COLORS = ("#F58518", "#B279A2", "#72B7B2")
TREND_COLOR = "#E45756"


def step_time_over_steps(
    times: StepTimes, title: str = "step time over the analysed steps (wall, ms)"
) -> go.Figure:
    """`times.spread` (data.step_spread) as the median over the ranks and, where `times.lines`
    lacks some rank, the min-max band; every rank of `times.lines` as its own line in the rank's
    colour (blamed ranks bold and named with a `!`, the others thin); the findings'
    `times.marks` as a shaded band (in the legend) from each onset step to the last step, and a
    dashed line for each trend. ms; the hover names the slowest rank of each step."""
    spread, lines = times.spread, times.lines
    fig = go.Figure()
    steps = spread["step"].to_numpy()
    drawn = sorted(int(r) for r in lines["rank"].unique()) if not lines.empty else []
    banded = not spread.empty and int(spread["ranks"].max()) > len(drawn)
    if banded:
        _band(fig, spread)
    fig.add_trace(
        go.Scatter(
            x=steps, y=spread["median_s"] * MS_PER_S, name="median over ranks", mode="lines",
            line={"color": MEDIAN_COLOR, "width": 2, "dash": "dot" if drawn else "solid"},
            customdata=spread["max_rank"],
            hovertemplate="step %{x}: median %{y:.1f} ms (slowest rank %{customdata})"
            "<extra></extra>",
        )
    )  # fmt: skip
    _rank_lines(fig, lines, times.blamed)
    _marks(fig, spread, times.marks)
    fig = apply_layout(fig, title, height=420)
    step_axis(fig, steps)
    fig.update_yaxes(title="ms per step (wall)", rangemode="tozero")
    return fig


def _band(fig: go.Figure, spread: pd.DataFrame) -> None:
    """The min-max band over the ranks: the max line, then the min line filled up to it."""
    steps = spread["step"].to_numpy()
    fig.add_trace(
        go.Scatter(
            x=steps, y=spread["max_s"] * MS_PER_S, mode="lines", line={"width": 0},
            legendgroup="band", showlegend=False, customdata=spread["max_rank"],
            hovertemplate="step %{x}: max %{y:.1f} ms on rank %{customdata}<extra></extra>",
        )
    )  # fmt: skip
    fig.add_trace(
        go.Scatter(
            x=steps, y=spread["min_s"] * MS_PER_S, mode="lines", line={"width": 0},
            fill="tonexty", fillcolor=BAND_COLOR, legendgroup="band",
            name=f"min-max over the {int(spread['ranks'].max())} ranks",
            hovertemplate="step %{x}: min %{y:.1f} ms<extra></extra>",
        )
    )  # fmt: skip


def _rank_lines(fig: go.Figure, lines: pd.DataFrame, blamed: Sequence[int]) -> None:
    """One line per rank of `lines` in the rank's own colour (base.rank_color: the same in
    every report); blamed ranks bold, named with a `!`, the others thin."""
    for rank, mine in lines.groupby("rank", sort=True):
        rank = int(rank)
        is_blamed = rank in blamed
        color, width = rank_color(rank), 3.0 if is_blamed else 1.5
        fig.add_trace(
            go.Scatter(
                x=mine["step"], y=mine["wall_s"] * MS_PER_S, mode="lines+markers",
                name=plain(rank_label(rank, blamed)), line={"color": color, "width": width},
                marker={"size": 6 if is_blamed else 4},
                hovertemplate=f"rank {rank}, step %{{x}}: %{{y:.1f}} ms<extra></extra>",
            )
        )  # fmt: skip


def _marks(fig: go.Figure, spread: pd.DataFrame, marks: StepMarks) -> None:
    """Each onset as a band from half a step before it to the end; each trend as its slope
    through the medians of the steps and of the slowest rank's walls, the series TRD001 fits."""
    steps = spread["step"].to_numpy()
    if len(steps) == 0:
        return
    last = float(steps.max())
    for i, onset in enumerate(marks.onsets):
        fig.add_vrect(
            x0=onset.step - 0.5, x1=last + 0.5, line_width=0, layer="below",
            fillcolor=ONSET_COLORS[i % len(ONSET_COLORS)], opacity=0.15,
            name=plain(onset.label), showlegend=True,
        )  # fmt: skip
    for trend in marks.trends:
        # Theil-Sen's line passes through the medians of x and y (Conover's intercept)
        x0, y0 = float(np.median(steps)), float(spread["max_s"].median())
        fitted = y0 + trend.slope_s_per_step * (steps - x0)
        fig.add_trace(
            go.Scatter(
                x=steps, y=fitted * MS_PER_S, mode="lines", name=plain(trend.label),
                line={"color": TREND_COLOR, "dash": "dash", "width": 2},
                hovertemplate="step %{x}: trend %{y:.1f} ms (slowest rank)<extra></extra>",
            )
        )  # fmt: skip
