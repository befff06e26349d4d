"""Timeline: per rank (rows) the spans of the chosen steps by phase and micro-batch, so the
pipeline bubble and a straggler show at a glance. Zoom with the mouse; pick the steps above.

Above `PER_RANK_MAX` ranks the timeline draws one group of ranks at a time (by host, stage, DP
replica or block; at first the group of the first blamed rank): a group x step heatmap of the
slowest rank's busy time leads, and a click on a cell draws that group at that step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard import figures
from dashboard.components import (
    HIDDEN,
    clicked_group,
    clicked_step,
    graph,
    group_control,
    group_options,
    grouping_control,
    no_data,
    page,
)
from dashboard.data import (
    GROUPINGS,
    LoadedRun,
    group_members,
    group_stats,
    groupings,
    pick,
    pick_group,
    pick_grouping,
    rank_groups,
    rank_step_values,
    rank_values,
    step_grid,
    timeline_steps,
    timeline_window,
)

PATH = "/timeline"
TITLE = "Timeline"
WINDOWS = (1, 2, 4)  # steps shown at once


def figure(
    loaded: LoadedRun, first_step: Any, window: Any, by: Any = "none", group: Any = None
) -> tuple[go.Figure, str]:
    """The timeline of the chosen steps (of one group's ranks when ranks are grouped), and a
    line saying which ranks it shows."""
    steps = timeline_steps(loaded)
    start = first_step if first_step in steps else steps[0]
    count = window if window in WINDOWS else WINDOWS[0]
    chosen = steps[steps.index(start) : steps.index(start) + count]
    grouping = pick_grouping(loaded, by)
    if grouping == "none":
        records = timeline_window(loaded.run, chosen)
        return figures.timeline(records.spans, records.comms, loaded.blamed_ranks), ""
    groups = rank_groups(loaded, grouping)
    name = pick_group(groups, group, loaded.blamed_ranks)
    members, size = group_members(groups, name, loaded.blamed_ranks)
    records = timeline_window(loaded.run, chosen, members)
    shown = f"{len(members)} of the {size} ranks" if size > len(members) else f"{size} ranks"
    title = f"spans per rank (ms): {name}, {shown}"
    fig = figures.timeline(records.spans, records.comms, loaded.blamed_ranks, title)
    return fig, f"{GROUPINGS[grouping]} {name}: {shown} of {len(groups)}"


def overview(loaded: LoadedRun, by: str) -> go.Figure:
    """Group x step: the busy time of each group's slowest rank, to pick a group and a step."""
    groups = rank_groups(loaded, by)
    grid = step_grid(rank_step_values(loaded.metrics.rank_steps, "busy"), groups)
    stats = group_stats(rank_values(loaded.metrics.ranks, "busy"), groups, loaded.blamed_ranks)
    flagged = stats.loc[stats["blamed"], "group"].tolist()
    title = f"busy per step, slowest rank of each {GROUPINGS[by]} (ms): click a cell to draw it"
    return figures.step_heatmap(grid, title, blamed_rows=flagged)


def grouped_parts(loaded: LoadedRun, by: str) -> tuple[list[Any], list[Any], Any, Any]:
    """For grouping `by`: the overview heatmap (none when not grouped), the group options and
    value, and the group selector's style."""
    if by == "none":
        return [], [], None, HIDDEN
    groups = rank_groups(loaded, by)
    group = pick_group(groups, None, loaded.blamed_ranks)
    heatmap = graph(overview(loaded, by), "timeline-groups")
    return [heatmap], group_options(groups), group, None


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    steps = timeline_steps(loaded)
    if not steps or loaded.run.spans.empty:
        return page(TITLE, no_data("no spans in the analysed steps: nothing to draw"))
    window_note = (
        f"a large run: spans are kept for steps below {loaded.run.span_steps} only (every "
        "step's time is in the heatmap)"
        if loaded.run.span_steps is not None
        else ""
    )
    by = pick_grouping(loaded, None)
    heatmap, _, group, _ = grouped_parts(loaded, by)
    groups = rank_groups(loaded, by) if by != "none" else None
    controls = html.Div(
        [
            grouping_control("timeline", groupings(loaded), by),
            group_control("timeline", groups, group),
            html.Label("first step", htmlFor="timeline-step"),
            dcc.Dropdown(
                id="timeline-step", options=steps, value=steps[0], clearable=False,
                className="step-select",
            ),
            html.Label("steps shown", htmlFor="timeline-window"),
            dcc.RadioItems(id="timeline-window", options=list(WINDOWS), value=1, inline=True),
        ],
        className="controls",
    )  # fmt: skip
    fig, shown = figure(loaded, steps[0], 1, by, group)
    return page(
        TITLE,
        html.Div(heatmap, id="timeline-overview"),
        controls,
        html.Div(window_note, className="note"),
        html.Div(shown, id="timeline-shown", className="note"),
        graph(fig, "timeline-graph"),
    )


def register(app: Dash, runs: Sequence[LoadedRun]) -> None:
    @app.callback(
        Output("timeline-overview", "children"),
        Output("timeline-group", "options"),
        Output("timeline-group", "value"),
        Output("timeline-group-box", "style"),
        Input("timeline-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def regroup(by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        return grouped_parts(loaded, pick_grouping(loaded, by))

    @app.callback(
        Output("timeline-group", "value", allow_duplicate=True),
        Output("timeline-step", "value"),
        Input("timeline-groups", "clickData"),
        State("timeline-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def select(click: Any, by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        groups = rank_groups(loaded, pick_grouping(loaded, by))
        group, step = clicked_group(click, groups), clicked_step(click)
        return (
            no_update if group is None else group,
            step if step in timeline_steps(loaded) else no_update,
        )

    @app.callback(
        Output("timeline-graph", "figure"),
        Output("timeline-shown", "children"),
        Input("timeline-step", "value"),
        Input("timeline-window", "value"),
        Input("timeline-group", "value"),
        State("timeline-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def redraw(first_step: Any, window: Any, group: Any, by: Any, run_index: Any) -> Any:
        return figure(pick(runs, run_index), first_step, window, by, group)
