"""Compare: every run the dashboard was started with, side by side (a scaling sweep or a
before/after set, read as `diag compare` reads it)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from dash import html

from dashboard import figures
from dashboard.components import graph, no_data, page, table
from dashboard.data import LoadedRun
from diag import compare_reports, format_metric

PATH = "/compare"
TITLE = "Compare"
_COLUMNS = {
    "run": "run", "layout": "layout", "world_size": "ranks", "step_time_s": "step s",
    "tokens_per_s": "tokens/s", "exposed_comm_share": "exposed comm",
    "bubble_fraction": "bubble", "first_finding": "first finding",
}  # fmt: skip


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    if len(runs) < 2:
        return page(TITLE, no_data("one run loaded: start the dashboard with two or more runs"))
    result = compare_reports([(r.name, r.report) for r in runs])
    rows = pd.DataFrame(result["runs"])
    shown = pd.DataFrame({
        label: [format_metric(key, v) if isinstance(v, float) else v for v in rows[key]]
        for key, label in _COLUMNS.items()
    })  # fmt: skip
    regressions = [
        html.Li(
            f"{r['run']}: {r['metric']} {format_metric(r['metric'], r['before'])} -> "
            f"{format_metric(r['metric'], r['after'])} ({r['change']:+.0%})"
        )
        for r in result["regressions"]
    ]
    return page(
        TITLE,
        html.Div(result["verdict"], className="verdict"),
        html.Ul(regressions),
        table(shown, "compare-table"),
        graph(figures.compare_runs(rows), "compare-runs"),
    )
