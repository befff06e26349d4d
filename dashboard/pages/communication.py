"""Communication: bytes per collective against the ledger, bus bandwidth, and the share of the
step spent communicating over the run."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html

from dashboard import figures
from dashboard.components import graph, no_data, page
from dashboard.data import LoadedRun, comm_share_by_step

PATH = "/communication"
TITLE = "Communication"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    collectives = loaded.metrics.collectives
    if collectives.empty:
        return page(TITLE, no_data("no collective records in the analysed steps"))
    shares = comm_share_by_step(loaded.metrics.rank_steps)
    return page(
        TITLE,
        graph(figures.bytes_vs_expected(collectives), "comm-bytes"),
        graph(figures.bus_bandwidth(collectives), "comm-busbw"),
        graph(figures.comm_share_over_steps(shares), "comm-share"),
    )
