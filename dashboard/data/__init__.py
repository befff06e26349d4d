"""The runs a dashboard serves and the tables its pages plot, importable from here:

- `dashboard.data.runs`: `LoadedRun`, `load_runs` (once, at start-up), `pick` (the run the
  browser names by its position);
- `dashboard.data.tables`: the per-step tables of the pages (timeline window, communication
  share, memory per rank, expert load);
- `dashboard.data.groups`: the groupings of ranks, every rank's group, a group's ranks to draw;
- `dashboard.data.per_group`: values per rank and their statistics per group (`StepGrid`,
  `group_stats`);
- `dashboard.data.step_times`: the step time per step over the ranks, the ranks drawn as lines,
  the steps the findings refer to (`StepMarks`).
"""

from __future__ import annotations

from dashboard.data.groups import (
    BLOCK_RANKS,
    GROUPINGS,
    PER_RANK_MAX,
    dp_replicas,
    group_members,
    groupings,
    pick_group,
    pick_grouping,
    rank_groups,
    world_ranks,
)
from dashboard.data.per_group import (
    RANK_METRICS,
    WAIT_METRICS,
    StepGrid,
    group_stats,
    memory_peaks,
    memory_totals,
    rank_metrics,
    rank_step_values,
    rank_values,
    step_grid,
    wait_values,
)
from dashboard.data.runs import LoadedRun, load_runs, pick
from dashboard.data.step_times import (
    STEP_LINES_MAX,
    Onset,
    StepMarks,
    StepTimes,
    Trend,
    line_ranks,
    rank_lines,
    step_marks,
    step_spread,
    step_times,
)
from dashboard.data.tables import (
    NS_PER_MS,
    ExpertSteps,
    Window,
    analysed_steps,
    comm_share_by_step,
    expert_steps,
    memory_at_peak,
    memory_of_rank,
    peak_rank,
    timeline_steps,
    timeline_window,
)

__all__ = [
    "BLOCK_RANKS",
    "GROUPINGS",
    "NS_PER_MS",
    "PER_RANK_MAX",
    "RANK_METRICS",
    "STEP_LINES_MAX",
    "WAIT_METRICS",
    "ExpertSteps",
    "LoadedRun",
    "Onset",
    "StepGrid",
    "StepMarks",
    "StepTimes",
    "Trend",
    "Window",
    "analysed_steps",
    "comm_share_by_step",
    "dp_replicas",
    "expert_steps",
    "group_members",
    "group_stats",
    "groupings",
    "line_ranks",
    "load_runs",
    "memory_at_peak",
    "memory_of_rank",
    "memory_peaks",
    "memory_totals",
    "peak_rank",
    "pick",
    "pick_group",
    "pick_grouping",
    "rank_groups",
    "rank_lines",
    "rank_metrics",
    "rank_step_values",
    "rank_values",
    "step_grid",
    "step_marks",
    "step_spread",
    "step_times",
    "timeline_steps",
    "timeline_window",
    "wait_values",
    "world_ranks",
]
