"""Ranks: busy / exposed comm / idle per rank (the exposed part split into arrival skew and
transfer when the run has an attribution) and each rank's busy time (a bar per rank, the
distribution above figures.RANK_BARS_MAX ranks); the ranks a finding singles out are marked (`!`
in labels, red outlines and lines), not every rank a job-wide finding names.

Up to `PER_RANK_MAX` ranks every rank is drawn. Above it the ranks are grouped (by host,
pipeline stage, DP replica or blocks of consecutive ranks): a group x step heatmap (the slowest
rank of each group at each step) and a chart of every group's median and slowest rank lead, and
one group's ranks at a time are drawn one by one below them (the drill-down: click a heatmap row
or a group, or pick the group). The heatmap of arrival skew or transfer has a column per
communication group instead of per step: the replay splits the waiting per rank and group, not
per step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from dash import Dash, Input, Output, State, dcc, html

from dashboard import figures
from dashboard.components import (
    graph,
    group_control,
    grouping_control,
    no_data,
    page,
    register_drill_down,
    register_regroup,
    table,
)
from dashboard.data import (
    GROUPINGS,
    WAIT_METRICS,
    LoadedRun,
    group_members,
    group_stats,
    groupings,
    pick,
    pick_group,
    pick_grouping,
    rank_groups,
    rank_metrics,
    rank_step_values,
    rank_values,
    step_grid,
    wait_values,
)
from diag import format_metric, rank_list

PATH = "/ranks"
TITLE = "Ranks"
DEFAULT_METRIC = "busy"


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    ranks = loaded.metrics.ranks
    if ranks.empty:
        return page(TITLE, no_data("no analysed steps: there is no per-rank time to show"))
    blamed = loaded.blamed_ranks
    note = f"blamed by the findings: {rank_list(blamed)}" if blamed else "no rank is blamed"
    by = pick_grouping(loaded, None)
    return page(
        TITLE,
        html.Div(note, className="blamed"),
        html.Div(grouping_control("ranks", groupings(loaded), by), className="controls"),
        html.Div(body(loaded, by), id="ranks-body"),
    )


def body(loaded: LoadedRun, by: str) -> list[Any]:
    """Everything under the grouping selector, for grouping `by`."""
    ranks, blamed = loaded.metrics.ranks, loaded.blamed_ranks
    histogram = graph(figures.busy_per_rank(ranks, blamed), "ranks-busy")
    if by == "none":
        return [graph(figures.rank_breakdown(ranks, blamed), "ranks-breakdown"), histogram,
                _table(loaded, ranks)]  # fmt: skip
    groups = rank_groups(loaded, by)
    group = pick_group(groups, None, blamed)
    metric_options = [
        {"label": name, "value": key} for key, (_, name) in rank_metrics(loaded).items()
    ]
    heatmap, bars = group_figures(loaded, by, DEFAULT_METRIC)
    return [
        html.Div(
            [
                html.Label("time shown", htmlFor="ranks-metric"),
                dcc.RadioItems(
                    id="ranks-metric", options=metric_options, value=DEFAULT_METRIC, inline=True
                ),
            ],
            className="controls",
        ),
        graph(heatmap, "ranks-heatmap"),
        graph(bars, "ranks-groups"),
        html.Div(group_control("ranks", groups, group), className="controls"),
        html.Div(detail(loaded, by, group), id="ranks-detail"),
        histogram,
    ]


def group_figures(loaded: LoadedRun, by: str, metric: str) -> tuple[Any, Any]:
    """The group x step heatmap (group x communication group for WAIT_METRICS) and the
    per-group median / slowest rank chart of `metric`."""
    groups = rank_groups(loaded, by)
    blamed = loaded.blamed_ranks
    metrics = rank_metrics(loaded)
    metric = metric if isinstance(metric, str) and metric in metrics else DEFAULT_METRIC
    name = metrics[metric][1]
    stats = group_stats(rank_values(loaded.metrics.ranks, metric), groups, blamed)
    flagged = stats.loc[stats["blamed"], "group"].tolist()
    kind = GROUPINGS[by]
    attribution = loaded.metrics.attribution
    if metric in WAIT_METRICS and attribution is not None:
        grid = step_grid(wait_values(attribution.waits, metric), groups, by="comm_group")
        replayed = f"{attribution.steps_replayed} replayed steps"
        heatmap = figures.step_heatmap(
            grid, f"{name} per step by communication group, the most of any rank in each "
            f"{kind} (ms, over {replayed})", blamed_rows=flagged, columns="communication group",
        )  # fmt: skip
        title = f"{name} per step by {kind}: median rank and max rank (ms, over {replayed})"
        return heatmap, figures.group_bars(stats, title)
    grid = step_grid(rank_step_values(loaded.metrics.rank_steps, metric), groups)
    heatmap = figures.step_heatmap(
        grid, f"{name} per step, the most of any rank in each {kind} (ms)", blamed_rows=flagged
    )
    bars = figures.group_bars(stats, f"{name} per step by {kind}: median rank and max rank (ms)")
    return heatmap, bars


def detail(loaded: LoadedRun, by: str, group: str) -> list[Any]:
    """One group's ranks one by one: the time split of each, and their table."""
    groups = rank_groups(loaded, by)
    members, size = group_members(groups, group, loaded.blamed_ranks)
    ranks = loaded.metrics.ranks
    shown = ranks[ranks["rank"].isin(members)]
    cut = (
        [html.Div(f"{len(members)} of the {size} ranks of {group} shown (blamed ranks first)",
                  className="note")]
        if size > len(members) else []
    )  # fmt: skip
    title = f"share of the step wall time per rank: {group}"
    return [
        *cut,
        graph(figures.rank_breakdown(shown, loaded.blamed_ranks, title), "ranks-breakdown"),
        _table(loaded, shown),
    ]


def _table(loaded: LoadedRun, ranks: pd.DataFrame) -> html.Table:
    """Rank, host, stage and the time split per step, with the replay's arrival skew and
    transfer as shares of the step when the run has them; blamed ranks first."""
    steps = ranks["steps"].clip(lower=1)
    rows = pd.DataFrame({
        "rank": ranks["rank"],
        "host": ranks["host"].astype(str),
        "stage": ranks["stage"],
        "blamed": ranks["rank"].isin(loaded.blamed_ranks).map({True: "yes", False: ""}),
        "busy ms": (1e3 * ranks["busy_s"] / steps).round(1),
        "exposed comm ms": (1e3 * ranks["exposed_comm_s"] / steps).round(1),
        "idle ms": (1e3 * ranks["idle_s"] / steps).round(1),
    })  # fmt: skip
    if "skew_s" in ranks and "transfer_s" in ranks:
        step = ranks["step_time_s"].where(ranks["step_time_s"] > 0)
        for column, name in (("skew_s", "skew"), ("transfer_s", "transfer")):
            shares = (pd.to_numeric(ranks[column], errors="coerce") / step).tolist()
            rows[name] = [format_metric(f"{name}_share", None if pd.isna(v) else v)
                          for v in shares]  # fmt: skip
    rows = rows.sort_values(["blamed", "rank"], ascending=[False, True])
    return table(rows, "ranks-table")


def register(app: Dash, runs: Sequence[LoadedRun]) -> None:
    register_regroup(app, runs, "ranks", body)

    @app.callback(
        Output("ranks-heatmap", "figure"),
        Output("ranks-groups", "figure"),
        Input("ranks-metric", "value"),
        State("ranks-group-by", "value"),
        State("run-select", "value"),
        prevent_initial_call=True,
    )
    def remetric(metric: Any, by: Any, run_index: Any) -> Any:
        loaded = pick(runs, run_index)
        return group_figures(loaded, pick_grouping(loaded, by), metric)

    register_drill_down(app, runs, "ranks", detail, lambda loaded: loaded.blamed_ranks)
