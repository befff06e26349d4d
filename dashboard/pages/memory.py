"""Memory: the six categories per rank and over steps, against the device budget.

A rank's memory is its peak (`RunMetrics.memory_peak`, the one the rules and `diag check` use):
the step whose six categories sum highest, drawn as that step's categories stacked.

Above `PER_RANK_MAX` ranks the ranks are grouped as on the Ranks page: a group x step heatmap of
the measured memory of each group's fullest rank, every group's median and fullest rank against
the budget, and the categories of one group's ranks at a time (click a group, or pick it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from dash import Dash, html

from dashboard import figures
from dashboard.components import (
    graph,
    group_control,
    grouping_control,
    no_data,
    page,
    register_drill_down,
    register_regroup,
)
from dashboard.data import (
    GROUPINGS,
    LoadedRun,
    group_members,
    group_stats,
    groupings,
    memory_at_peak,
    memory_of_rank,
    memory_peaks,
    memory_totals,
    peak_rank,
    pick_group,
    pick_grouping,
    rank_groups,
    step_grid,
)

PATH = "/memory"
TITLE = "Memory"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    rank = peak_rank(loaded.metrics.memory_peak)
    if rank is None:
        return page(TITLE, no_data("no memory records in this run"))
    budget = loaded.budget_bytes
    per_step = memory_of_rank(loaded.metrics.memory_steps, rank)
    notes = [] if budget else [html.Div("no device budget declared (--device-memory-gb)")]
    by = pick_grouping(loaded, None)
    return page(
        TITLE,
        *notes,
        html.Div(grouping_control("memory", groupings(loaded), by), className="controls"),
        html.Div(body(loaded, by), id="memory-body"),
        graph(figures.memory_over_steps(per_step, rank, budget), "memory-steps"),
    )


def body(loaded: LoadedRun, by: str) -> list[Any]:
    """Everything under the grouping selector, for grouping `by`."""
    budget = loaded.budget_bytes
    if by == "none":
        return [graph(figures.memory_by_rank(_at_peak(loaded), budget), "memory-ranks")]
    groups = rank_groups(loaded, by)
    group = pick_group(groups, None, _fullest(loaded))
    stats = group_stats(memory_peaks(loaded.metrics.memory_peak), groups, loaded.blamed_ranks)
    grid = step_grid(memory_totals(loaded.metrics.memory_steps), groups)
    kind = GROUPINGS[by]
    flagged = stats.loc[stats["blamed"], "group"].tolist()
    heatmap = figures.step_heatmap(
        grid, f"measured memory per step, fullest rank of each {kind} (MiB)", "MiB",
        blamed_rows=flagged, scale=figures.MIB,
    )  # fmt: skip
    bars = figures.group_bars(
        stats, f"memory peak by {kind}: median rank and fullest rank (MiB, each rank's peak)",
        "MiB", scale=figures.MIB, budget_bytes=budget,
    )  # fmt: skip
    return [
        graph(heatmap, "memory-heatmap"),
        graph(bars, "memory-groups"),
        html.Div(group_control("memory", groups, group), className="controls"),
        html.Div(detail(loaded, by, group), id="memory-detail"),
    ]


def _fullest(loaded: LoadedRun) -> list[int]:
    """The rank with the highest peak: the drill-down starts at its group."""
    rank = peak_rank(loaded.metrics.memory_peak)
    return [] if rank is None else [rank]


def _at_peak(loaded: LoadedRun) -> pd.DataFrame:
    """Every rank's six categories at its peak step: its bars stack up to its peak."""
    return memory_at_peak(loaded.metrics.memory_peak, loaded.metrics.memory_steps)


def detail(loaded: LoadedRun, by: str, group: str) -> list[Any]:
    """One group's ranks one by one: their categories at each rank's peak step."""
    groups = rank_groups(loaded, by)
    members, size = group_members(groups, group, _fullest(loaded))
    at_peak = _at_peak(loaded)
    shown = at_peak[at_peak["rank"].isin(members)]
    cut = (
        [html.Div(f"{len(members)} of the {size} ranks of {group} shown", className="note")]
        if size > len(members) else []
    )  # fmt: skip
    title = f"memory per rank by category (MiB, at each rank's peak step): {group}"
    fig = figures.memory_by_rank(shown, loaded.budget_bytes, title)
    return [*cut, graph(fig, "memory-ranks")]


def register(app: Dash, runs: Sequence[LoadedRun]) -> None:
    register_regroup(app, runs, "memory", body)
    register_drill_down(app, runs, "memory", detail, _fullest)
