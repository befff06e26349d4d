"""Small layout pieces shared by the pages. Every string is passed to Dash as text, which React
escapes: names from traces and manifests never become HTML."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from dash import dcc, html

from diag.report import PATTERN_NAMES, rank_list

GRAPH_CONFIG: Any = {"displaylogo": False, "responsive": True}


def no_data(message: str) -> html.Div:
    """What a page shows instead of empty axes."""
    return html.Div(message, className="no-data")


def graph(figure: go.Figure, graph_id: str) -> dcc.Graph:
    return dcc.Graph(id=graph_id, figure=figure, config=GRAPH_CONFIG, className="graph")


def page(title: str, *children: Any) -> html.Div:
    return html.Div([html.H2(title), *children], className="page")


def tiles(items: Sequence[tuple[str, str]]) -> html.Div:
    """Headline numbers: (label, value) pairs."""
    return html.Div(
        [
            html.Div([html.Div(value, className="tile-value"), html.Div(label)], className="tile")
            for label, value in items
        ],
        className="tiles",
    )


def finding_card(finding: dict[str, Any], first: bool) -> html.Div:
    pattern = finding.get("pattern")
    where = f"pattern {pattern}, {PATTERN_NAMES[pattern]}" if pattern else "pitfall"
    ranks = finding.get("ranks") or []
    head = [
        html.Span(finding["severity"].upper(), className=f"severity {finding['severity']}"),
        html.Span(f" {finding['rule']} ", className="rule"),
        html.Span(where, className="pattern"),
    ]
    body = [html.Div(finding["title"], className="finding-title")]
    if ranks:
        body.append(html.Div(f"ranks: {rank_list(ranks)}", className="blamed"))
    if finding.get("advice"):
        body.append(html.Div(f"fix: {finding['advice']}", className="advice"))
    return html.Div(
        [html.Div(head, className="finding-head"), *body],
        className="finding main" if first else "finding",
    )


def table(frame: pd.DataFrame, table_id: str) -> html.Table:
    """A plain HTML table of `frame` (cells as text; None and NaN shown as n/a)."""
    head = html.Thead(html.Tr([html.Th(str(c)) for c in frame.columns]))
    rows = [
        html.Tr([html.Td("n/a" if pd.isna(v) else str(v)) for v in row])
        for row in frame.itertuples(index=False)
    ]
    return html.Table([head, html.Tbody(rows)], id=table_id, className="table")
