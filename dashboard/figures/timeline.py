"""The Timeline page's figure: the spans and collectives of some steps, one row per rank."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import apply_layout, collective_names, plain, rank_label, rank_labels

PHASE_COLORS = {
    "fwd": "#4C78A8",
    "bwd": "#F58518",
    "opt": "#54A24B",
    "data": "#B279A2",
    "comm_wait": "#E45756",
}
OTHER_COLOR = "#9D9D9D"
TIMELINE_MAX_LABELS = 300
"""Above this many spans the timeline drops the micro-batch text inside bars (the hover keeps
it): placing text costs the browser more than drawing the bars."""


def timeline(
    spans: pd.DataFrame,
    comms: pd.DataFrame,
    blamed: Sequence[int] = (),
    title: str = "spans per rank (ms)",
) -> go.Figure:
    """Per rank (rows) the spans of the chosen steps as bars on one clock, coloured by phase,
    text saying the micro-batch, and the collectives as thin dark bars over them. Both tables
    have rank, step, start_ms, duration_ms; spans also phase and mb, comms op, group and tag.
    One bar trace per phase: the cost grows with the spans drawn, so callers keep the ranks few
    (dashboard.data.PER_RANK_MAX)."""
    fig = go.Figure()
    labelled = len(spans) <= TIMELINE_MAX_LABELS
    ranks = sorted(int(r) for r in spans["rank"].unique())
    order = [rank_label(r, blamed) for r in ranks]
    for phase, group in spans.groupby("phase", sort=False):
        mb = ("mb " + group["mb"].astype("Int64").astype(str)).where(group["mb"].notna(), "")
        mb = mb.tolist()
        fig.add_trace(
            go.Bar(
                orientation="h",
                name=plain(phase),
                y=rank_labels(group["rank"], blamed),
                x=group["duration_ms"],
                base=group["start_ms"],
                text=mb if labelled else None,
                textposition="inside",
                textangle=0,
                insidetextanchor="middle",
                marker={"color": PHASE_COLORS.get(str(phase), OTHER_COLOR)},
                customdata=list(zip(group["step"], mb, strict=True)),
                hovertemplate=f"{plain(phase)} %{{customdata[1]}} step %{{customdata[0]}}<br>"
                "start %{base:.1f} ms, %{x:.1f} ms<extra>%{y}</extra>",
            )
        )
    if not comms.empty:
        names = collective_names(comms)
        fig.add_trace(
            go.Bar(
                orientation="h",
                name="collective",
                y=rank_labels(comms["rank"], blamed),
                x=comms["duration_ms"],
                base=comms["start_ms"],
                width=0.25,
                marker={"color": "#222222"},
                customdata=names,
                hovertemplate="%{customdata}<br>start %{base:.1f} ms, %{x:.2f} ms"
                "<extra>%{y}</extra>",
            )
        )
    height = max(300, 28 * len(ranks) + 120)
    fig = apply_layout(fig, title, barmode="overlay", height=height)
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], type="category")
    fig.update_xaxes(title="ms from the first span of the window")
    return fig
