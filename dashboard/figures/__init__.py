"""Pure figure builders: tables in, `go.Figure` out, no Dash and no file access.

One module per page (`overview`, `timeline`, `ranks`, `communication`, `memory`, `experts`,
`compare`), the Overview's step time over the steps in `steps` (the HTML report draws it too),
the figures of groups of ranks that three pages share in `groups`, and what every figure shares
(layout, labels, `plain()`, MiB) in `base`. The builders are importable from here:
`figures.timeline` is the builder, not the module.
"""

from __future__ import annotations

from dashboard.figures.base import MIB, plain, rank_label, rank_labels, wrapped
from dashboard.figures.communication import bus_bandwidth, bytes_vs_expected, comm_share_over_steps
from dashboard.figures.compare import compare_runs
from dashboard.figures.experts import drop_rate_over_steps, expert_heatmap
from dashboard.figures.failure import stuck_collective
from dashboard.figures.groups import group_bars, step_heatmap
from dashboard.figures.memory import memory_by_rank, memory_over_steps
from dashboard.figures.overview import step_waterfall
from dashboard.figures.ranks import busy_histogram, rank_breakdown
from dashboard.figures.steps import step_time_over_steps
from dashboard.figures.timeline import timeline

__all__ = [
    "MIB",
    "bus_bandwidth",
    "busy_histogram",
    "bytes_vs_expected",
    "comm_share_over_steps",
    "compare_runs",
    "drop_rate_over_steps",
    "expert_heatmap",
    "group_bars",
    "memory_by_rank",
    "memory_over_steps",
    "plain",
    "rank_breakdown",
    "rank_label",
    "rank_labels",
    "step_heatmap",
    "step_time_over_steps",
    "step_waterfall",
    "stuck_collective",
    "timeline",
    "wrapped",
]
