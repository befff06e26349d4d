"""Small layout pieces shared by the pages. Every string is passed to Dash as text, which React
escapes: names from traces and manifests never become HTML."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from dashboard.data import GROUPINGS, LoadedRun, pick, pick_group, pick_grouping, rank_groups
from dashboard.figures import plain
from diag import Verdict

GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}


def no_data(message: str) -> html.Div:
    """What a page shows instead of empty axes."""
    return html.Div(message, className="no-data")


def graph(figure: go.Figure, graph_id: str) -> dcc.Graph:
    return dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG, className="graph")


def page(title: str, *children: Any) -> html.Div:
    return html.Div([html.H2(title), *children], className="page")


def finding_card(finding: Verdict, first: bool) -> html.Article:
    """A finding as a card (`diag.verdicts`): its severity in words on a badge and as the card's
    colour, what is wrong, who (marked when the finding singles ranks out), what it costs, why,
    the fix, and the catalogue's rule and pattern in a smaller line (with a tooltip)."""
    rows = [("who", finding.who, "who blamed" if finding.singled_out else "who"),
            ("cost", finding.cost, "cost"), ("why", finding.why, "why"),
            ("fix", finding.fix, "fix")]  # fmt: skip
    facts: list[Any] = []
    for name, text, cls in rows:
        if text:
            facts += [html.Dt(name), html.Dd(text, className=cls)]
    return html.Article(
        [
            html.Div(
                [
                    html.Span(finding.severity_text, className="sev"),
                    html.Span(finding.what, className="what"),
                ]
            ),
            html.Dl(facts),
            html.Div(
                finding.catalogue,
                className="catalogue",
                title="the rule and the collapse pattern of the catalogue (docs/rules.md)",
            ),
        ],
        className=f"finding card {finding.severity}" + (" main" if first else ""),
    )


def healthy_card() -> html.Article:
    return html.Article(
        [html.Span("OK", className="sev"),
         html.Span("No finding: nothing in this run crosses a rule's threshold", className="what")],
        className="finding card ok",
    )  # fmt: skip


def facts(items: Sequence[tuple[str, str]]) -> html.Div:
    """The headline as labelled facts (`diag.summary_items`)."""
    return html.Div(
        [
            html.Div([html.Div(label, className="label"), html.Div(value, className="value")],
                     className="fact")
            for label, value in items
        ],
        className="facts", id="overview-facts",
    )  # fmt: skip


def table(frame: pd.DataFrame, table_id: str) -> html.Table:
    """A plain HTML table of `frame` (cells as text; None and NaN shown as n/a)."""
    head = html.Thead(html.Tr([html.Th(str(c)) for c in frame.columns]))
    rows = [
        html.Tr([html.Td("n/a" if pd.isna(v) else str(v)) for v in row])
        for row in frame.itertuples(index=False)
    ]
    return html.Table([head, html.Tbody(rows)], id=table_id, className="table")


# --- Grouping controls --------------------------------------------------------------------------

HIDDEN: dict[str, str] = {"display": "none"}


def grouping_control(prefix: str, choices: Sequence[str], value: str) -> html.Div:
    """The "group ranks by" selector (`{prefix}-group-by`); present but hidden when the run has
    one way only, so the page's callbacks always find it."""
    options = [{"label": GROUPINGS[c], "value": c} for c in choices]
    return html.Div(
        [
            html.Label("group ranks by", htmlFor=f"{prefix}-group-by"),
            dcc.Dropdown(
                id=f"{prefix}-group-by", options=options, value=value, clearable=False,
                className="group-by-select",
            ),
        ],
        className="control",
        style=HIDDEN if len(choices) < 2 else None,
    )  # fmt: skip


def group_options(groups: pd.DataFrame) -> list[dict[str, Any]]:
    """One option per group of `groups` (dashboard.data.rank_groups), with its rank count."""
    sizes = groups.groupby("order", sort=True)["group"].agg(["first", "size"])
    return [
        {"label": f"{name} ({size} ranks)", "value": name}
        for name, size in zip(sizes["first"], sizes["size"], strict=True)
    ]


def group_control(prefix: str, groups: pd.DataFrame | None, value: str | None) -> html.Div:
    """The group selector of the drill-down (`{prefix}-group`); hidden when ranks are not
    grouped (`groups` None)."""
    return html.Div(
        [
            html.Label("group", htmlFor=f"{prefix}-group"),
            dcc.Dropdown(
                id=f"{prefix}-group",
                options=group_options(groups) if groups is not None else [],
                value=value, clearable=False, className="group-select",
            ),
        ],
        id=f"{prefix}-group-box",
        className="control",
        style=HIDDEN if groups is None else None,
    )  # fmt: skip


def clicked_group(click: Any, groups: pd.DataFrame, axis: str = "y") -> str | None:
    """The group a click on a group heatmap row (`axis` y) or group bar (x) landed on: figures
    label a group with its name through `plain()`, with " !" when it holds a blamed rank."""
    try:
        label = click["points"][0][axis]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(label, str):
        return None
    for name in groups["group"].unique():
        if label in (plain(str(name)), plain(str(name)) + " !"):
            return str(name)
    return None


def clicked_step(click: Any) -> int | None:
    """The step (x) of a click on a group x step heatmap."""
    try:
        step = click["points"][0]["x"]
    except (KeyError, IndexError, TypeError):
        return None
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None


def register_regroup(
    app: Dash, runs: Sequence[LoadedRun], prefix: str, body: Callable[[LoadedRun, str], Any]
) -> None:
    """A new choice in the `{prefix}-group-by` selector redraws `{prefix}-body` as
    `body(loaded, grouping)`."""

    @app.callback(
        Output(f"{prefix}-body", "children"),
        Input(f"{prefix}-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def regroup(by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        return body(loaded, pick_grouping(loaded, by))


def register_drill_down(
    app: Dash,
    runs: Sequence[LoadedRun],
    prefix: str,
    detail: Callable[[LoadedRun, str, str], Any],
    preferred: Callable[[LoadedRun], Sequence[int]],
) -> None:
    """The drill-down of a grouped page: a click on a row of the `{prefix}-heatmap` (group x
    step) or on a bar of the `{prefix}-groups` chart picks that group in the `{prefix}-group`
    selector, and the selector's group is drawn rank by rank in `{prefix}-detail` by
    `detail(loaded, grouping, group)` (an unknown group: the one holding the first of
    `preferred(loaded)`)."""
    register_group_click(app, runs, prefix)

    @app.callback(
        Output(f"{prefix}-detail", "children"),
        Input(f"{prefix}-group", "value"),
        State(f"{prefix}-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def drill(group: Any, by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        chosen = pick_grouping(loaded, by)
        if chosen == "none":
            return no_update
        groups = rank_groups(loaded, chosen)
        return detail(loaded, chosen, pick_group(groups, group, preferred(loaded)))


def register_group_click(app: Dash, runs: Sequence[LoadedRun], prefix: str) -> None:
    """A click on a row of the `{prefix}-heatmap` (group x step) or on a bar of the
    `{prefix}-groups` chart picks that group in the `{prefix}-group` selector."""

    @app.callback(
        Output(f"{prefix}-group", "value"),
        Input(f"{prefix}-heatmap", "clickData"),
        Input(f"{prefix}-groups", "clickData"),
        State(f"{prefix}-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def select(row_click: Any, bar_click: Any, by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        groups = rank_groups(loaded, pick_grouping(loaded, by))
        if ctx.triggered_id == f"{prefix}-groups":
            group = clicked_group(bar_click, groups, "x")
        else:
            group = clicked_group(row_click, groups, "y")
        return group if group is not None else no_update
