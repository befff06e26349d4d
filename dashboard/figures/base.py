"""What every figure shares: the plotly layout, labels, MiB, the blame colour, the rank colours.

Plotly renders a subset of HTML inside text (`<b>`, `<a href>`, `<br>`); names that come from
traces and manifests (phases, ops, groups, hosts) go through `plain()` so they show as typed.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

MIB = 1024**2
BLAME_COLOR = "#D62728"
STEP_TICKS_MAX = 20
"""Up to this many steps a step axis has a tick at every step; above it plotly picks them."""


def plain(text: object) -> str:
    """Text that plotly shows literally (its HTML subset escaped)."""
    return html.escape(str(text), quote=False)


def apply_layout(fig: go.Figure, title: str, **kwargs: object) -> go.Figure:
    fig.update_layout(
        title=plain(title),
        template="plotly_white",
        margin={"l": 70, "r": 20, "t": 50, "b": 50},
        # the legend in rows at the bottom of the figure, placed in the container: plotly then
        # grows the bottom margin to hold it under the x axis's title (a legend below the plot
        # in paper coordinates lands on that title in a short figure)
        legend={"orientation": "h", "yref": "container", "y": 0, "yanchor": "bottom"},
        **kwargs,
    )
    return fig


def step_axis(fig: go.Figure, steps: Sequence[int] | pd.Series) -> None:
    """An x axis of steps: whole-step ticks (each step up to STEP_TICKS_MAX steps) and half a
    step of room at each end, so that a first step 0 keeps its tick label off the y axis's."""
    values = [int(s) for s in steps]
    fig.update_xaxes(title="step", tickformat="d")
    if values:
        first, last = min(values), max(values)
        fig.update_xaxes(range=[first - 0.5, last + 0.5])
        if last - first <= STEP_TICKS_MAX:
            fig.update_xaxes(dtick=1, tick0=first)


RANK_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2", "#9D755D", "#EECA3B",
               "#FF9DA6", "#2F4B7C", "#8CD17D")  # fmt: skip
"""The rank palette (Tableau 10 without its red, kept for blame): rank r gets colour r mod 10."""


def rank_color(rank: int) -> str:
    """A rank's colour, from its number only: the same rank has the same colour in every chart,
    page and report of any run, whichever ranks are blamed or drawn."""
    return RANK_COLORS[int(rank) % len(RANK_COLORS)]


def rank_label(rank: int, blamed: Sequence[int] = ()) -> str:
    return f"rank {rank} !" if rank in blamed else f"rank {rank}"


def rank_labels(ranks: pd.Series | Sequence[int], blamed: Sequence[int] = ()) -> list[str]:
    """rank_label of every rank, computed once per distinct rank."""
    series = pd.Series(ranks, dtype="int64")
    distinct = series.unique()
    labels = dict(zip(distinct, (rank_label(int(r), blamed) for r in distinct), strict=True))
    return series.map(labels).tolist()


def wrapped(text: object, width: int = 24) -> str:
    """`plain(text)` in lines of about `width` characters (plotly's `<br>`), for axis labels."""
    return "<br>".join(plain(line) for line in textwrap.wrap(str(text), width)) or plain(text)


def collective_names(collectives: pd.DataFrame) -> list[str]:
    """`op group tag` of every collective (rows with op, group, tag), as plain text."""
    return [
        plain(f"{op} {group} {tag}".strip())
        for op, group, tag in zip(
            collectives["op"],
            collectives["group"],
            collectives["tag"].astype(object).fillna(""),
            strict=True,
        )
    ]


def budget_line(fig: go.Figure, budget_bytes: float | None) -> None:
    """A dashed line at the device budget (MiB) on `fig`, when the run declares one."""
    if budget_bytes:
        fig.add_hline(
            y=budget_bytes / MIB,
            line={"color": BLAME_COLOR, "dash": "dash"},
            annotation_text=f"device budget {budget_bytes / MIB:.0f} MiB",
        )
