"""Timeline: per rank (rows) the spans of the chosen steps by phase and micro-batch, so the
pipeline bubble and a straggler show at a glance. Zoom with the mouse; pick the steps above."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html

from dashboard import figures
from dashboard.components import graph, no_data, page
from dashboard.data import LoadedRun, analysed_steps, pick, timeline_window

PATH = "/timeline"
TITLE = "Timeline"
WINDOWS = (1, 2, 4)  # steps shown at once


def figure(loaded: LoadedRun, first_step: Any, window: Any) -> go.Figure:
    steps = analysed_steps(loaded)
    start = first_step if first_step in steps else steps[0]
    count = window if window in WINDOWS else WINDOWS[0]
    chosen = steps[steps.index(start) : steps.index(start) + count]
    window_records = timeline_window(loaded.run, chosen)
    return figures.timeline(window_records.spans, window_records.comms, loaded.blamed_ranks)


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    steps = analysed_steps(loaded)
    if not steps or loaded.run.spans.empty:
        return page(TITLE, no_data("no spans in the analysed steps: nothing to draw"))
    controls = html.Div(
        [
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
    return page(TITLE, controls, graph(figure(loaded, steps[0], 1), "timeline-graph"))


def register(app: Dash, runs: Sequence[LoadedRun]) -> None:
    @app.callback(
        Output("timeline-graph", "figure"),
        Input("timeline-step", "value"),
        Input("timeline-window", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def redraw(first_step: Any, window: Any, run_index: Any) -> go.Figure:
        return figure(pick(runs, run_index), first_step, window)
