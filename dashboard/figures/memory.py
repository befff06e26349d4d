"""The Memory page's figures: the categories per rank, and one rank's over the steps."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import MIB, apply_layout, budget_line, rank_labels, step_axis
from diag.contract import schema

CATEGORY_COLORS = dict(
    zip(
        schema.MEMORY_CATEGORIES,
        ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#9D9D9D"),
        strict=True,
    )
)


def memory_by_rank(
    memory: pd.DataFrame,
    budget_bytes: float | None = None,
    title: str = "memory per rank by category (MiB, at each rank's peak step)",
) -> go.Figure:
    """Per rank, the six categories of `memory` (MiB, stacked; a rank's categories at its peak
    step stack up to its peak, `data.memory_at_peak`); a category null everywhere left out."""
    labels = rank_labels(memory["rank"])
    fig = go.Figure()
    for category in schema.MEMORY_CATEGORIES:
        if memory[category].notna().any():
            fig.add_trace(
                go.Bar(
                    x=labels, y=memory[category] / MIB, name=category,
                    marker_color=CATEGORY_COLORS[category],
                )
            )  # fmt: skip
    budget_line(fig, budget_bytes)
    fig = apply_layout(fig, title, barmode="stack")
    fig.update_yaxes(title="MiB")
    return fig


def memory_over_steps(
    per_step: pd.DataFrame, rank: int, budget_bytes: float | None = None
) -> go.Figure:
    """One rank's six categories per step (MiB, stacked). A category recorded at every step is
    an area; one recorded only at some steps (activations sampled every N steps: null between)
    is a marker at each sample, stacked on top of the areas, so that it shows the total with it
    and nothing is drawn where it was not measured (never a fall to 0 between samples)."""
    fig = go.Figure()
    present = [c for c in schema.MEMORY_CATEGORIES if per_step[c].notna().any()]
    sampled = [c for c in present if per_step[c].isna().any()]
    for category in [c for c in present if c not in sampled]:
        fig.add_trace(
            go.Scatter(
                x=per_step["step"], y=per_step[category] / MIB, name=category,
                stackgroup="memory", mode="lines", line={"color": CATEGORY_COLORS[category]},
                hovertemplate=f"{category}, step %{{x}}: %{{y:.1f}} MiB<extra></extra>",
            )
        )  # fmt: skip
    for category in sampled:
        held = per_step[per_step[category].notna()]
        fig.add_trace(
            go.Scatter(
                x=held["step"], y=held[category] / MIB, stackgroup="memory", mode="markers",
                name=f"{category} (sampled at {len(held)} of {len(per_step)} steps)",
                marker={"color": CATEGORY_COLORS[category], "size": 9, "symbol": "diamond"},
                fill="none",
                hovertemplate=f"{category}, step %{{x}}: %{{y:.1f}} MiB (sampled)<extra></extra>",
            )
        )  # fmt: skip
    # between its samples a sampled category has no point; plotly's default counts that as 0 for
    # what stacks above it, "interpolate" does not (only a second sampled category stacks there)
    fig.update_traces(stackgaps="interpolate", selector={"stackgroup": "memory"})
    budget_line(fig, budget_bytes)
    fig = apply_layout(fig, f"memory of rank {rank} over steps (MiB)")
    step_axis(fig, per_step["step"])
    fig.update_yaxes(title="MiB")
    return fig
