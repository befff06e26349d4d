"""The Ranks page's figures: each rank's split of the step, and its busy time (a bar per rank,
or the distribution over many ranks)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import BLAME_COLOR, apply_layout, plain, rank_color, rank_labels

MIN_SHARE_DRAWN = 0.005
"""A part of the per-rank time split below this share of the step on every rank is left out of
the stack (the exposed time outside the replay's waits is often zero, up to rounding)."""


def rank_breakdown(
    ranks: pd.DataFrame,
    blamed: Sequence[int] = (),
    title: str = "share of the step wall time per rank",
) -> go.Figure:
    """Per rank, busy / exposed communication / idle as shares of its step wall time (stacked).
    When the ranks table has the replay's split of the waiting (`skew_s`, `transfer_s`), the
    exposed communication is drawn as its parts: arrival skew, transfer, and the rest of it."""
    labels = rank_labels(ranks["rank"], blamed)
    fig = go.Figure()
    for name, share, color in _time_split(ranks):
        fig.add_trace(
            go.Bar(
                x=labels, y=share, name=name, marker_color=color,
                hovertemplate=f"%{{x}}: {plain(name)} %{{y:.1%}}<extra></extra>",
            )
        )  # fmt: skip
    line = np.where(ranks["rank"].isin(list(blamed)), 3, 0).tolist()
    fig.update_traces(marker_line={"width": line, "color": BLAME_COLOR}, selector={"name": "busy"})
    fig = apply_layout(fig, title, barmode="stack")
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    return fig


def _time_split(ranks: pd.DataFrame) -> list[tuple[str, pd.Series, str]]:
    """(name, share of the step wall time, color) of each part of a rank's step, in stack order.

    Skew and transfer are per replayed step and the exposed share over the analysed steps: the
    two come from different windows when the replay keeps only the first steps, so where they
    exceed the exposed share they are scaled down to it (the stack never passes the step)."""

    def column(name: str) -> pd.Series:
        return pd.to_numeric(ranks[name], errors="coerce").astype("float64")

    busy, idle, exposed = column("busy_frac"), column("idle_frac"), column("exposed_comm_share")
    if "skew_s" not in ranks or "transfer_s" not in ranks:
        return [("busy", busy, "#4C78A8"), ("exposed comm", exposed, "#E45756"),
                ("idle", idle, "#BAB0AC")]  # fmt: skip
    step = column("step_time_s")
    step = step.where(step > 0)
    skew, transfer = column("skew_s") / step, column("transfer_s") / step
    waiting = skew + transfer
    fit = (exposed / waiting.where(waiting > exposed)).fillna(1.0)
    other = (exposed - waiting * fit).clip(lower=0)
    parts = [
        ("busy", busy, "#4C78A8"),
        ("exposed: arrival skew", skew * fit, "#E45756"),
        ("exposed: transfer", transfer * fit, "#F58518"),
        ("exposed: other", other, "#FF9DA6"),
        ("idle", idle, "#BAB0AC"),
    ]
    return [p for p in parts if p[0] != "exposed: other" or (other > MIN_SHARE_DRAWN).any()]


RANK_BARS_MAX = 48
"""Up to this many ranks the busy time is a bar per rank; above it, its distribution."""


def busy_per_rank(ranks: pd.DataFrame, blamed: Sequence[int] = ()) -> go.Figure:
    """Each rank's busy time per step: a bar per rank (in the rank's colour, blamed ranks
    outlined and named with a `!`) up to RANK_BARS_MAX ranks, else the distribution over the
    ranks (`busy_histogram`). ms from zero."""
    if len(ranks) > RANK_BARS_MAX:
        return busy_histogram(ranks, blamed)
    busy_ms = 1e3 * ranks["busy_s"] / ranks["steps"].clip(lower=1)
    marked = ranks["rank"].isin(list(blamed))
    fig = go.Figure(
        go.Bar(
            x=rank_labels(ranks["rank"], blamed), y=busy_ms, name="busy",
            marker={"color": [rank_color(int(r)) for r in ranks["rank"]],
                    "line": {"width": np.where(marked, 3, 0).tolist(), "color": BLAME_COLOR}},
            hovertemplate="%{x}: %{y:.1f} ms busy per step<extra></extra>",
        )
    )  # fmt: skip
    fig = apply_layout(fig, "busy time per step of each rank (ms)", bargap=0.3)
    fig.update_xaxes(type="category")
    fig.update_yaxes(title="busy ms per step", rangemode="tozero")
    return fig


ANNOTATION_ROWS = 3
"""Heights the blamed ranks' labels cycle through in the histogram, so near lines' labels do not
sit on each other."""


def busy_histogram(ranks: pd.DataFrame, blamed: Sequence[int] = ()) -> go.Figure:
    """Histogram of per-rank busy time per step (from zero ms); blamed ranks marked by lines."""
    busy_ms = 1e3 * ranks["busy_s"] / ranks["steps"].clip(lower=1)
    fig = go.Figure(go.Histogram(x=busy_ms, name="ranks", marker_color="#4C78A8"))
    marked = ranks["rank"].isin(list(blamed)).to_numpy()
    values, names = busy_ms.to_numpy()[marked], ranks["rank"].to_numpy()[marked]
    # a line and a label per blamed rank, set at once (plotly's add_vline re-validates every
    # shape each call: quadratic in the 128 ranks of a blamed pipeline stage); many of them
    # are one line per distinct value, labelled with their count
    lines: dict[float, list[int]] = {}
    for rank, value in zip(names.tolist(), values.tolist(), strict=True):
        lines.setdefault(round(float(value), 3), []).append(int(rank))
    fig.update_layout(
        shapes=[{"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0,
                 "y1": 1, "line": {"color": BLAME_COLOR, "dash": "dash"}}
                for x in lines],
        annotations=[{"xref": "x", "yref": "paper", "x": x, "y": 1, "showarrow": False,
                      "yanchor": "bottom", "yshift": 16 * (i % ANNOTATION_ROWS),
                      "text": _ranks_label(members)}
                     for i, (x, members) in enumerate(sorted(lines.items()))],
    )  # fmt: skip
    fig = apply_layout(fig, "busy time per step across ranks (ms)", bargap=0.05)
    fig.update_layout(margin={"t": 50 + 16 * min(len(lines), ANNOTATION_ROWS)})
    # both axes from zero: the x labels stand off, or its "0" sits on the y axis's
    fig.update_xaxes(title="busy ms per step", rangemode="tozero", ticklabelstandoff=10)
    fig.update_yaxes(title="ranks")
    return fig


def _ranks_label(ranks: list[int]) -> str:
    """`rank 3`, `ranks 3, 5`, or `12 ranks (3, 5, ...)` for a line many ranks share."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= 3:
        return "ranks " + ", ".join(map(str, ranks))
    return f"{len(ranks)} ranks ({ranks[0]}, {ranks[1]}, ...)"
