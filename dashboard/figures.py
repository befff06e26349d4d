"""Pure figure builders: tables in, `go.Figure` out, no Dash and no file access.

Plotly renders a subset of HTML inside text (`<b>`, `<a href>`, `<br>`); names that come from
traces and manifests (phases, ops, groups, hosts) go through `plain()` so they show as typed.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dashboard.data import StepGrid
from diag import schema

MIB = 1024**2
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
BLAME_COLOR = "#D62728"
MIN_SHARE_DRAWN = 0.005
"""A part of the per-rank time split below this share of the step on every rank is left out of
the stack (the exposed time outside the replay's waits is often zero, up to rounding)."""
CATEGORY_COLORS = dict(
    zip(
        schema.MEMORY_CATEGORIES,
        ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#9D9D9D"),
        strict=True,
    )
)


def plain(text: object) -> str:
    """Text that plotly shows literally (its HTML subset escaped)."""
    return html.escape(str(text), quote=False)


def _layout(fig: go.Figure, title: str, **kwargs: object) -> go.Figure:
    fig.update_layout(
        title=plain(title),
        template="plotly_white",
        margin={"l": 70, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.15},
        **kwargs,
    )
    return fig


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


# --- Overview -----------------------------------------------------------------------------------

COST_COLOR = "#E45756"
OVERLAP_COLOR = "#54A24B"
STEP_COLOR = "#4C78A8"


def step_waterfall(attribution: Mapping[str, Any]) -> go.Figure:
    """Where the step goes, from a report's `attribution` (diag.whatif, as
    `diag.report.attribution_section` writes it in text): the ideal step (every imbalance and
    transfer removed) as the first bar, each cause with a cost on top of it (largest first),
    the rest (not attributed; negative: the causes overlap, removing them one by one counts
    some time twice), and the measured step (replayed) as the total. ms per step; the hover
    adds the share of the step."""
    measured_s, ideal_s = attribution["replayed_step_s"], attribution["ideal_step_s"]
    causes = [c for c in attribution["causes"] if c["cost_s"] > 0]
    rest_s = measured_s - ideal_s - sum(c["cost_s"] for c in causes)
    names = ["ideal step", *(str(c["label"]) for c in causes),
             "overlap of the causes" if rest_s < 0 else "not attributed",
             "measured step (replayed)"]  # fmt: skip
    values_s = [ideal_s, *(c["cost_s"] for c in causes), rest_s, measured_s]
    shares = [ideal_s / measured_s if measured_s else None, *(c["cost_share"] for c in causes),
              rest_s / measured_s if measured_s else None, 1.0]  # fmt: skip
    labels = _unique_labels([wrapped(name) for name in names])
    ends = (0, len(values_s) - 1)  # the ideal and the measured step: sizes, not changes
    text = [f"{1e3 * v:.1f}" if i in ends else f"{1e3 * v:+.1f}" for i, v in enumerate(values_s)]
    fig = go.Figure(
        go.Waterfall(
            x=labels,
            y=[1e3 * v for v in values_s],  # the total's value is the sum plotly draws anyway
            measure=["absolute", *["relative"] * (len(causes) + 1), "total"],
            text=text,
            textposition="outside",
            customdata=[plain(_share_text(share)) for share in shares],
            hovertemplate="%{x}<br>%{y:.1f} ms per step, %{customdata}<extra></extra>",
            increasing={"marker": {"color": COST_COLOR}},
            decreasing={"marker": {"color": OVERLAP_COLOR}},
            totals={"marker": {"color": STEP_COLOR}},
            connector={"line": {"color": "#BBBBBB", "dash": "dot"}},
            showlegend=False,
        )
    )
    title = (
        f"where the step goes (what-if replay of {attribution['steps_replayed']} steps, replay "
        f"error {_share_text(attribution['replay_error'], of='')})"
    )
    fig = _layout(fig, title, height=460)
    fig.update_layout(margin={"b": 110})  # room for the wrapped cause labels
    fig.update_xaxes(type="category", tickangle=0)
    fig.update_yaxes(title="ms per step", rangemode="tozero")
    return fig


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


# --- Timeline -----------------------------------------------------------------------------------


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
        names = _collective_names(comms)
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
    fig = _layout(fig, title, barmode="overlay", height=height)
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], type="category")
    fig.update_xaxes(title="ms from the first span of the window")
    return fig


# --- Ranks --------------------------------------------------------------------------------------


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
    fig = _layout(fig, title, barmode="stack")
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


def busy_histogram(ranks: pd.DataFrame, blamed: Sequence[int] = ()) -> go.Figure:
    """Histogram of per-rank busy time per step; blamed ranks marked on the axis."""
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
                      "yanchor": "bottom", "text": _ranks_label(members)}
                     for x, members in lines.items()],
    )  # fmt: skip
    fig = _layout(fig, "busy time per step across ranks (ms)", bargap=0.05)
    fig.update_xaxes(title="busy ms per step")
    fig.update_yaxes(title="ranks")
    return fig


def _ranks_label(ranks: list[int]) -> str:
    """`rank 3`, `ranks 3, 5`, or `12 ranks (3, 5, ...)` for a line many ranks share."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) <= 3:
        return "ranks " + ", ".join(map(str, ranks))
    return f"{len(ranks)} ranks ({ranks[0]}, {ranks[1]}, ...)"


# --- Groups of ranks ----------------------------------------------------------------------------


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
    fig = _layout(fig, title, height=height)
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
    _budget_line(fig, budget_bytes)
    fig = _layout(fig, title, bargap=0.15)
    fig.update_xaxes(type="category")
    fig.update_yaxes(title=plain(unit), rangemode="tozero")
    return fig


# --- Communication ------------------------------------------------------------------------------


def _collective_names(collectives: pd.DataFrame) -> list[str]:
    return [
        plain(f"{op} {group} {tag}".strip())
        for op, group, tag in zip(
            collectives["op"],
            collectives["group"],
            collectives["tag"].astype(object).fillna(""),
            strict=True,
        )
    ]


def bytes_vs_expected(collectives: pd.DataFrame) -> go.Figure:
    """Per op / group / tag, bytes per step measured and expected from the ledger (MiB)."""
    names = _collective_names(collectives)
    expected = collectives["bytes_per_step"] / collectives["ratio"]  # ratio = measured/expected
    fig = go.Figure([
        go.Bar(x=names, y=collectives["bytes_per_step"] / MIB, name="measured"),
        go.Bar(x=names, y=expected / MIB, name="expected (ledger)"),
    ])  # fmt: skip
    fig = _layout(fig, "bytes per step per rank (MiB): measured vs expected", barmode="group")
    fig.update_yaxes(title="MiB per step")
    return fig


def bus_bandwidth(collectives: pd.DataFrame) -> go.Figure:
    """Per op / group / tag, the bus bandwidth (GB/s, nccl-tests' busbw)."""
    fig = go.Figure(
        go.Bar(
            x=_collective_names(collectives),
            y=collectives["busbw_GBps"],
            marker_color="#72B7B2",
            name="bus bandwidth",
        )
    )
    fig = _layout(fig, "bus bandwidth per collective (GB/s)")
    fig.update_yaxes(title="GB/s")
    return fig


def comm_share_over_steps(shares: pd.DataFrame) -> go.Figure:
    """Per step, the communication share (median and slowest rank) and the exposed share."""
    fig = go.Figure()
    for column, name, dash in (
        ("comm_median", "comm share (median rank)", "solid"),
        ("comm_max", "comm share (max rank)", "dot"),
        ("exposed_median", "exposed comm share (median rank)", "dash"),
    ):
        fig.add_trace(
            go.Scatter(
                x=shares["step"], y=shares[column], name=name, mode="lines+markers",
                line={"dash": dash},
            )
        )  # fmt: skip
    fig = _layout(fig, "communication share of the step over the run")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(title="step")
    return fig


# --- Memory -------------------------------------------------------------------------------------


def _budget_line(fig: go.Figure, budget_bytes: float | None) -> None:
    if budget_bytes:
        fig.add_hline(
            y=budget_bytes / MIB,
            line={"color": BLAME_COLOR, "dash": "dash"},
            annotation_text=f"device budget {budget_bytes / MIB:.0f} MiB",
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
    _budget_line(fig, budget_bytes)
    fig = _layout(fig, title, barmode="stack")
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
    _budget_line(fig, budget_bytes)
    fig = _layout(fig, f"memory of rank {rank} over steps (MiB)")
    fig.update_xaxes(title="step")
    fig.update_yaxes(title="MiB")
    return fig


# --- Experts ------------------------------------------------------------------------------------


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
    fig = _layout(fig, f"MoE layer {layer}: tokens per expert per step")
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
    fig = _layout(fig, "drop rate per step (dropped / routed)")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(title="step")
    return fig


# --- Compare ------------------------------------------------------------------------------------


def compare_runs(rows: pd.DataFrame) -> go.Figure:
    """Runs side by side: throughput (bars) and exposed communication share (markers)."""
    labels = [
        plain(f"{run} ({layout})") for run, layout in zip(rows["run"], rows["layout"], strict=True)
    ]
    fig = go.Figure([
        go.Bar(x=labels, y=rows["tokens_per_s"], name="tokens/s", marker_color="#4C78A8"),
        go.Scatter(
            x=labels, y=rows["exposed_comm_share"], name="exposed comm share", yaxis="y2",
            mode="markers", marker={"size": 14, "color": "#E45756"},
        ),
    ])  # fmt: skip
    fig = _layout(
        fig,
        "throughput and exposed communication per run",
        yaxis={"title": "tokens/s"},
        yaxis2={"title": "exposed comm", "overlaying": "y", "side": "right", "tickformat": ".0%",
                "range": [0, 1]},
    )  # fmt: skip
    return fig
