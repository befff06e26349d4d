"""Experts: tokens per expert per step (one heatmap per MoE layer) and the drop rate over steps."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html

from dashboard import figures
from dashboard.components import graph, no_data, page
from dashboard.data import LoadedRun, expert_steps

PATH = "/experts"
TITLE = "Experts"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    layers = expert_steps(loaded.run.experts)
    if not layers:
        return page(TITLE, no_data("no MoE expert records: not an expert-parallel run"))
    heatmaps = [
        graph(figures.expert_heatmap(x.layer, x.steps, x.tokens), f"experts-{x.layer}")
        for x in layers
    ]
    drops = figures.drop_rate_over_steps([(x.layer, x.steps, x.drop_rate) for x in layers])
    return page(TITLE, graph(drops, "experts-drops"), *heatmaps)
