"""Ranks: busy / exposed comm / idle per rank and the histogram of busy time; the ranks the
findings blame are marked (`!` in labels, red outlines and lines)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from dash import html

from dashboard import figures
from dashboard.components import graph, no_data, page, table
from dashboard.data import LoadedRun
from diag.report import rank_list

PATH = "/ranks"
TITLE = "Ranks"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    ranks = loaded.metrics.ranks
    if ranks.empty:
        return page(TITLE, no_data("no analysed steps: there is no per-rank time to show"))
    blamed = loaded.blamed_ranks
    note = f"blamed by the findings: {rank_list(blamed)}" if blamed else "no rank is blamed"
    return page(
        TITLE,
        html.Div(note, className="blamed"),
        graph(figures.rank_breakdown(ranks, blamed), "ranks-breakdown"),
        graph(figures.busy_histogram(ranks, blamed), "ranks-histogram"),
        _table(loaded),
    )


def _table(loaded: LoadedRun) -> html.Table:
    """Rank, host, stage and the time split per step; blamed ranks first."""
    ranks = loaded.metrics.ranks
    steps = ranks["steps"].clip(lower=1)
    rows = pd.DataFrame({
        "rank": ranks["rank"],
        "host": ranks["host"].astype(str),
        "stage": ranks["stage"],
        "blamed": ["yes" if int(r) in loaded.blamed_ranks else "" for r in ranks["rank"]],
        "busy ms": (1e3 * ranks["busy_s"] / steps).round(1),
        "exposed comm ms": (1e3 * ranks["exposed_comm_s"] / steps).round(1),
        "idle ms": (1e3 * ranks["idle_s"] / steps).round(1),
    }).sort_values(["blamed", "rank"], ascending=[False, True])  # fmt: skip
    return table(rows, "ranks-table")
