"""The Compare page's figure: the runs side by side."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import apply_layout, wrapped


def compare_runs(rows: pd.DataFrame) -> go.Figure:
    """Runs side by side: throughput (bars) and exposed communication share (markers)."""
    # run names are long (and hostile): wrapped in lines of a few words, upright, so that
    # neighbours never overlap however many runs there are
    labels = [
        wrapped(f"{run} ({layout})", 16)
        for run, layout in zip(rows["run"], rows["layout"], strict=True)
    ]
    fig = go.Figure([
        go.Bar(x=labels, y=rows["tokens_per_s"], name="tokens/s", marker_color="#4C78A8"),
        go.Scatter(
            x=labels, y=rows["exposed_comm_share"], name="exposed comm share", yaxis="y2",
            mode="markers", marker={"size": 14, "color": "#E45756"},
        ),
    ])  # fmt: skip
    fig = apply_layout(
        fig,
        "throughput and exposed communication per run",
        yaxis={"title": "tokens/s"},
        yaxis2={"title": "exposed comm", "overlaying": "y", "side": "right", "tickformat": ".0%",
                "range": [0, 1]},
    )  # fmt: skip
    fig.update_xaxes(tickangle=0, automargin=True)
    return fig
