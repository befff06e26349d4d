"""Memory: the six categories per rank and over steps, against the device budget."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html

from dashboard import figures
from dashboard.components import graph, no_data, page
from dashboard.data import LoadedRun, memory_of_rank, peak_rank

PATH = "/memory"
TITLE = "Memory"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    memory = loaded.metrics.memory
    rank = peak_rank(memory)
    if rank is None:
        return page(TITLE, no_data("no memory records in this run"))
    budget = loaded.budget_bytes
    per_step = memory_of_rank(loaded.metrics.memory_steps, rank)
    notes = [] if budget else [html.Div("no device budget declared (--device-memory-gb)")]
    return page(
        TITLE,
        *notes,
        graph(figures.memory_by_rank(memory, budget), "memory-ranks"),
        graph(figures.memory_over_steps(per_step, rank, budget), "memory-steps"),
    )
