"""The Communication page's figures: bytes against the ledger, bus bandwidth, share of the step."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.figures.base import MIB, apply_layout, collective_names, step_axis


def bytes_vs_expected(collectives: pd.DataFrame) -> go.Figure:
    """Per op / group / tag, bytes per step measured and expected from the ledger (MiB)."""
    names = collective_names(collectives)
    expected = collectives["bytes_per_step"] / collectives["ratio"]  # ratio = measured/expected
    fig = go.Figure([
        go.Bar(x=names, y=collectives["bytes_per_step"] / MIB, name="measured"),
        go.Bar(x=names, y=expected / MIB, name="expected (ledger)"),
    ])  # fmt: skip
    fig = apply_layout(fig, "bytes per step per rank (MiB): measured vs expected", barmode="group")
    fig.update_yaxes(title="MiB per step")
    return fig


def bus_bandwidth(collectives: pd.DataFrame) -> go.Figure:
    """Per op / group / tag, the bus bandwidth (GB/s, nccl-tests' busbw)."""
    fig = go.Figure(
        go.Bar(
            x=collective_names(collectives),
            y=collectives["busbw_GBps"],
            marker_color="#72B7B2",
            name="bus bandwidth",
        )
    )
    fig = apply_layout(fig, "bus bandwidth per collective (GB/s)")
    fig.update_yaxes(title="GB/s")
    return fig


def comm_share_over_steps(shares: pd.DataFrame) -> go.Figure:
    """Per step, the communication share (median and slowest rank) and the exposed share."""
    fig = go.Figure()
    for column, name, dash in (
        ("comm_median", "comm share (median rank)", "solid"),
        ("comm_max", "comm share (max rank)", "dot"),
        ("exposed_median", "exposed comm share (median rank)", "dash"),
    ):
        fig.add_trace(
            go.Scatter(
                x=shares["step"], y=shares[column], name=name, mode="lines+markers",
                line={"dash": dash},
            )
        )  # fmt: skip
    fig = apply_layout(fig, "communication share of the step over the run")
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    step_axis(fig, shares["step"])
    return fig
