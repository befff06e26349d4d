"""The figures of the HTML report (`diag analyze RUN --format html`), built by the dashboard's own
figure functions over the same tables, without Dash: what the pages show first, fixed in one page.

- where the step goes (the Overview's waterfall of the what-if replay),
- the step time over the analysed steps (the Overview's: per rank, or the median and min-max
  band over many ranks with the blamed ranks' lines; the findings' onsets and trends marked),
- the timeline of the first analysed steps,
- the time split per rank (busy, exposed communication, idle),
- bytes per collective against the ledger,
- memory by category per rank, and one rank's memory over the steps,
- the expert load (MoE runs).

Up to `PER_RANK_MAX` ranks every rank is drawn. Above it the ranks are grouped as the dashboard
groups them by default (host, stage, DP replica or blocks of ranks): the group x step heatmap and
the groups' median and slowest rank lead, and one group is drawn rank by rank: the group of the
first blamed rank (the fullest rank's group for memory), as the dashboard's drill-down starts. So
the page grows with the groups, not the ranks (1,024 ranks: 2.4 MB, tests/unit/test_html_report.py).

Imports plotly, pandas and the dashboard's data module, never Dash.
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.offline

from dashboard import figures
from dashboard.data import (
    GROUPINGS,
    LoadedRun,
    comm_share_by_step,
    expert_steps,
    group_members,
    group_stats,
    memory_at_peak,
    memory_of_rank,
    memory_peaks,
    memory_totals,
    peak_rank,
    pick_group,
    pick_grouping,
    rank_groups,
    rank_step_values,
    rank_values,
    step_grid,
    step_times,
    timeline_steps,
    timeline_window,
)
from diag import RunData, RunMetrics

TIMELINE_STEPS = 2
"""Steps drawn in the timeline, from the first analysed step (the dashboard starts there)."""
MAX_EXPERT_LAYERS = 8
"""MoE layers drawn as heatmaps (the drop rate shows every layer)."""

Figures = list[tuple[str, go.Figure]]


def report_figures(run: RunData, metrics: RunMetrics, report: dict[str, object]) -> Figures:
    """(section, figure) pairs in page order for a diagnosed run (`diag.diagnose`)."""
    loaded = LoadedRun(run.manifest.run_id or run.path.name, run, metrics, dict(report))
    by = pick_grouping(loaded, None)
    return [
        *_stuck(loaded),  # a run that did not finish: the collective it stopped in, first
        *_step(loaded),
        *_step_time(loaded),
        *_timeline(loaded, by),
        *_ranks(loaded, by),
        *_communication(loaded),
        *_memory(loaded, by),
        *_experts(loaded),
    ]


def report_charts(
    run: RunData, metrics: RunMetrics, report: dict[str, object]
) -> list[tuple[str, str]]:
    """`report_figures` as (section, plotly JSON) pairs, for `diag.outputs.report.render_html`."""
    return [(section, figure.to_json()) for section, figure in report_figures(run, metrics, report)]


@functools.cache
def plotly_js_gzip() -> bytes:
    """The plotly.js bundle of the installed plotly package, gzip-compressed (once a process)."""
    return gzip.compress(plotly.offline.get_plotlyjs().encode("utf-8"), compresslevel=9, mtime=0)


def _stuck(loaded: LoadedRun) -> Figures:
    figure = figures.stuck_collective(loaded.report)
    return [] if figure is None else [("the collective the job stopped in", figure)]


def _step(loaded: LoadedRun) -> Figures:
    attribution = loaded.report.get("attribution")
    if not isinstance(attribution, dict) or not attribution.get("replayed_step_s"):
        return []
    return [("where the step goes", figures.step_waterfall(attribution))]


def _step_time(loaded: LoadedRun) -> Figures:
    times = step_times(loaded)
    return [] if times is None else [("step time over steps", figures.step_time_over_steps(times))]


def _timeline(loaded: LoadedRun, by: str) -> Figures:
    steps = timeline_steps(loaded)[:TIMELINE_STEPS]
    if not steps or loaded.run.spans.empty:
        return []
    section = f"timeline of step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}"
    blamed = loaded.blamed_ranks
    if by == "none":
        window = timeline_window(loaded.run, steps)
        return [(section, figures.timeline(window.spans, window.comms, blamed))]
    groups = rank_groups(loaded, by)
    name = pick_group(groups, None, blamed)
    members, size = group_members(groups, name, blamed)
    window = timeline_window(loaded.run, steps, members)
    shown = f"{len(members)} of the {size} ranks" if size > len(members) else f"{size} ranks"
    title = f"spans per rank (ms): {name}, {shown}"  # as the Timeline page titles it
    return [(section, figures.timeline(window.spans, window.comms, blamed, title))]


def _ranks(loaded: LoadedRun, by: str) -> Figures:
    ranks, blamed = loaded.metrics.ranks, loaded.blamed_ranks
    if ranks.empty:
        return []
    section = "time per rank"
    if by == "none":
        return [(section, figures.rank_breakdown(ranks, blamed))]
    groups, kind = rank_groups(loaded, by), GROUPINGS[by]
    stats = group_stats(rank_values(ranks, "busy"), groups, blamed)
    flagged = stats.loc[stats["blamed"], "group"].tolist()
    grid = step_grid(rank_step_values(loaded.metrics.rank_steps, "busy"), groups)
    heatmap = figures.step_heatmap(
        grid, f"busy per step, the most of any rank in each {kind} (ms)", blamed_rows=flagged
    )
    bars = figures.group_bars(stats, f"busy per step by {kind}: median rank and max rank (ms)")
    group = pick_group(groups, None, blamed)
    members, _ = group_members(groups, group, blamed)
    shown = ranks[ranks["rank"].isin(members)]
    title = f"share of the step wall time per rank: {group}"
    return [(section, heatmap), (section, bars),
            (section, figures.rank_breakdown(shown, blamed, title))]  # fmt: skip


def _communication(loaded: LoadedRun) -> Figures:
    collectives = loaded.metrics.collectives
    if collectives.empty:
        return []
    shares = comm_share_by_step(loaded.metrics.rank_steps)
    section = "communication"
    return [(section, figures.bytes_vs_expected(collectives)),
            (section, figures.comm_share_over_steps(shares))]  # fmt: skip


def _memory(loaded: LoadedRun, by: str) -> Figures:
    rank = peak_rank(loaded.metrics.memory_peak)
    if rank is None:
        return []
    section, budget = "memory", loaded.budget_bytes
    at_peak = memory_at_peak(loaded.metrics.memory_peak, loaded.metrics.memory_steps)
    per_step = memory_of_rank(loaded.metrics.memory_steps, rank)
    over_steps = (section, figures.memory_over_steps(per_step, rank, budget))
    if by == "none":
        return [(section, figures.memory_by_rank(at_peak, budget)), over_steps]
    groups, kind = rank_groups(loaded, by), GROUPINGS[by]
    stats = group_stats(memory_peaks(loaded.metrics.memory_peak), groups, loaded.blamed_ranks)
    flagged = stats.loc[stats["blamed"], "group"].tolist()
    grid = step_grid(memory_totals(loaded.metrics.memory_steps), groups)
    heatmap = figures.step_heatmap(
        grid, f"measured memory per step, fullest rank of each {kind} (MiB)", "MiB",
        blamed_rows=flagged, scale=figures.MIB,
    )  # fmt: skip
    bars = figures.group_bars(
        stats, f"memory peak by {kind}: median rank and fullest rank (MiB, each rank's peak)",
        "MiB", scale=figures.MIB, budget_bytes=budget,
    )  # fmt: skip
    group = pick_group(groups, None, [rank])
    members, _ = group_members(groups, group, [rank])
    title = f"memory per rank by category (MiB, at each rank's peak step): {group}"
    detail = figures.memory_by_rank(at_peak[at_peak["rank"].isin(members)], budget, title)
    return [(section, heatmap), (section, bars), (section, detail), over_steps]


def _experts(loaded: LoadedRun) -> Figures:
    layers = expert_steps(loaded.run.experts)
    if not layers:
        return []
    section = "expert load"
    drops = figures.drop_rate_over_steps([(x.layer, x.steps, x.drop_rate) for x in layers])
    heatmaps: Sequence[tuple[str, go.Figure]] = [
        (section, figures.expert_heatmap(x.layer, x.steps, x.tokens))
        for x in layers[:MAX_EXPERT_LAYERS]
    ]
    return [(section, drops), *heatmaps]
