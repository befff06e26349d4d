"""The stuck collective of a run that did not finish (issue 40): per rank, how long it waited
in the collective the job stopped in, and the ranks that never joined it, from the report's
`failure` and `where_stopped` (diag/metrics/failure.py)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from dashboard.figures.base import apply_layout, plain

WAIT_COLOR = "#E45756"
MISSING_COLOR = "#4C78A8"


def stuck_collective(report: dict[str, Any]) -> go.Figure | None:
    """The first stuck collective: a bar per waiting rank (its wait, s), a mark per rank that
    never joined (where it stopped in the hover); None when the run has no stuck collective."""
    stuck = ((report.get("failure") or {}).get("stuck") or [])[:1]
    if not stuck:
        return None
    one = stuck[0]
    where = {row["rank"]: row for row in report.get("where_stopped") or []}
    waits = {int(r): s for r, s in (one.get("waited_s") or {}).items()}
    waiting = [r for r in one.get("waiting") or []]
    missing = [r for r in one.get("missing") or []]
    fig = go.Figure()
    fig.add_trace(go.Bar(
        orientation="h", name="waited in it", marker={"color": WAIT_COLOR},
        y=[f"rank {r}" for r in waiting], x=[waits.get(r) or 0.0 for r in waiting],
        hovertemplate="%{y} waited %{x:.2f} s<extra></extra>",
    ))  # fmt: skip
    if missing:
        fig.add_trace(go.Scatter(
            mode="markers+text", name="never joined", marker={"color": MISSING_COLOR, "size": 12,
                                                              "symbol": "x"},
            y=[f"rank {r}" for r in missing], x=[0.0] * len(missing),
            text=[plain(f"never joined: {_stopped(where.get(r))}") for r in missing],
            textposition="middle right", hoverinfo="text",
        ))  # fmt: skip
    step = f", step {one['step']}" if one.get("step") is not None else ""
    title = f"stuck: {one['op']} #{one['seq']} of {one['group']}{step}"
    ranks = len(waiting) + len(missing)
    fig = apply_layout(fig, title, height=max(240, 40 * ranks + 120))
    fig.update_xaxes(title="seconds waited in the collective")
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def _stopped(row: dict[str, Any] | None) -> str:
    if not row:
        return "no record"
    parts = [f"step {row['step']}" if row.get("step") is not None else "",
             str(row.get("span") or ""), str(row.get("stack_top") or "")]  # fmt: skip
    return ", ".join(p for p in parts if p) or str(row.get("state"))
