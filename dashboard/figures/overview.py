"""The Overview page's figure: where the step goes (the what-if attribution as a waterfall)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from dashboard.figures.base import apply_layout, wrapped

COST_COLOR = "#E45756"
IDEAL_COLOR = "#C9D3DD"
STEP_COLOR = "#4C78A8"
MEASURED = "measured step (replayed)"
IDEAL = "ideal step"


def step_waterfall(attribution: Mapping[str, Any]) -> go.Figure:
    """Where the step goes, from a report's `attribution` (diag.whatif): one horizontal bar per
    row, read top to bottom: the measured step (replayed), the ideal step (every imbalance and
    transfer removed), then each cause with a cost (largest first) measured alone: the ideal
    step plus what removing only that cause saves, the cause's part in red and labelled with its
    ms and share. The causes overlap, so their parts need not add up to the gap: the page says
    so in words (`diag.attribution_words`) rather than with a negative bar. ms per step, the
    axis from zero."""
    measured_s, ideal_s = attribution["replayed_step_s"], attribution["ideal_step_s"]
    causes = drawn_causes(attribution)
    names = _unique_labels([MEASURED, IDEAL, *(wrapped(c["label"], 34) for c in causes)])
    costs_ms = [1e3 * c["cost_s"] for c in causes]
    shares = [_share_text(c["cost_share"]) for c in causes]
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            y=names[:1], x=[1e3 * measured_s], orientation="h", name="measured step",
            marker_color=STEP_COLOR, text=[f"{1e3 * measured_s:.1f} ms"],
            textposition="outside", cliponaxis=False, showlegend=False,
            hovertemplate="measured step (replayed): %{x:.1f} ms<extra></extra>",
        )
    )  # fmt: skip
    fig.add_trace(
        go.Bar(
            y=names[1:], x=[1e3 * ideal_s] * (len(causes) + 1), orientation="h",
            name="ideal step", marker_color=IDEAL_COLOR, showlegend=False,
            text=[f"{1e3 * ideal_s:.1f} ms", *[""] * len(causes)], textposition="inside",
            insidetextanchor="end",
            hovertemplate="ideal step: %{x:.1f} ms<extra></extra>",
        )
    )  # fmt: skip
    if causes:
        fig.add_trace(
            go.Bar(
                y=names[2:], x=costs_ms, orientation="h", name="cost of the cause alone",
                marker_color=COST_COLOR, showlegend=False,
                text=[f"+{v:.1f} ms ({_share_text(c['cost_share'], of='')})"
                      for v, c in zip(costs_ms, causes, strict=True)],
                textposition="outside", cliponaxis=False, customdata=shares,
                hovertemplate="%{y}<br>+%{x:.1f} ms per step, %{customdata}<extra></extra>",
            )
        )  # fmt: skip
    title = (
        f"where the step goes (what-if replay of {attribution['steps_replayed']} steps, replay "
        f"error {_share_text(attribution['replay_error'], of='')})"
    )
    # the labels outside the bars need room right of the longest: two fifths more axis
    longest = max([measured_s, *(ideal_s + c["cost_s"] for c in causes)])
    fig = apply_layout(fig, title, height=140 + 46 * len(names), barmode="stack")
    fig.update_layout(margin={"l": 20, "r": 30, "t": 50, "b": 50}, bargap=0.3)
    fig.update_xaxes(title="ms per step", range=[0, 1.4e3 * longest])
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=names[::-1],
                     automargin=True)  # fmt: skip
    return fig


MIN_COST_SHARE_DRAWN = 0.005
"""Causes costing less than this share of the step are left out of the chart (the words say how
many): a row of `+0.0 ms` is noise to a reader."""


def drawn_causes(attribution: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The causes the chart draws: those costing at least MIN_COST_SHARE_DRAWN of the step."""
    return [
        c for c in attribution["causes"]
        if c["cost_s"] > 0 and (c.get("cost_share") or 0) >= MIN_COST_SHARE_DRAWN
    ]  # fmt: skip


def _share_text(share: float | None, of: str = " of the step") -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%{of}"


def _unique_labels(labels: list[str]) -> list[str]:
    """Labels made unique (a category axis draws equal labels as one bar): ` (2)`, ` (3)`."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
