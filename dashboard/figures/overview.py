"""The Overview page's figure: where the step goes (the what-if attribution as a waterfall)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from dashboard.figures.base import apply_layout, plain, wrapped

COST_COLOR = "#E45756"
OVERLAP_COLOR = "#54A24B"
STEP_COLOR = "#4C78A8"


def step_waterfall(attribution: Mapping[str, Any]) -> go.Figure:
    """Where the step goes, from a report's `attribution` (diag.whatif, as
    `diag.outputs.report.attribution_section` writes it in text): the ideal step (every imbalance
    and transfer removed) as the first bar, each cause with a cost on top of it (largest first), the
    rest (not attributed; negative: the causes overlap, removing them one by one counts some time
    twice), and the measured step (replayed) as the total. ms per step; the hover adds the share of
    the step."""
    measured_s, ideal_s = attribution["replayed_step_s"], attribution["ideal_step_s"]
    causes = [c for c in attribution["causes"] if c["cost_s"] > 0]
    rest_s = measured_s - ideal_s - sum(c["cost_s"] for c in causes)
    names = ["ideal step", *(str(c["label"]) for c in causes),
             "overlap of the causes" if rest_s < 0 else "not attributed",
             "measured step (replayed)"]  # fmt: skip
    values_s = [ideal_s, *(c["cost_s"] for c in causes), rest_s, measured_s]
    shares = [ideal_s / measured_s if measured_s else None, *(c["cost_share"] for c in causes),
              rest_s / measured_s if measured_s else None, 1.0]  # fmt: skip
    labels = _unique_labels([wrapped(name) for name in names])
    ends = (0, len(values_s) - 1)  # the ideal and the measured step: sizes, not changes
    text = [f"{1e3 * v:.1f}" if i in ends else f"{1e3 * v:+.1f}" for i, v in enumerate(values_s)]
    fig = go.Figure(
        go.Waterfall(
            x=labels,
            y=[1e3 * v for v in values_s],  # the total's value is the sum plotly draws anyway
            measure=["absolute", *["relative"] * (len(causes) + 1), "total"],
            text=text,
            textposition="outside",
            customdata=[plain(_share_text(share)) for share in shares],
            hovertemplate="%{x}<br>%{y:.1f} ms per step, %{customdata}<extra></extra>",
            increasing={"marker": {"color": COST_COLOR}},
            decreasing={"marker": {"color": OVERLAP_COLOR}},
            totals={"marker": {"color": STEP_COLOR}},
            connector={"line": {"color": "#BBBBBB", "dash": "dot"}},
            showlegend=False,
        )
    )
    title = (
        f"where the step goes (what-if replay of {attribution['steps_replayed']} steps, replay "
        f"error {_share_text(attribution['replay_error'], of='')})"
    )
    fig = apply_layout(fig, title, height=460)
    fig.update_layout(margin={"b": 110})  # room for the wrapped cause labels
    fig.update_xaxes(type="category", tickangle=0)
    fig.update_yaxes(title="ms per step", rangemode="tozero")
    return fig


def _share_text(share: float | None, of: str = " of the step") -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%{of}"


def _unique_labels(labels: list[str]) -> list[str]:
    """Labels made unique (a category axis draws equal labels as one bar): ` (2)`, ` (3)`."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out
