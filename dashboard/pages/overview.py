"""Overview: the diagnosis first (findings ranked, main one on top), then the headline numbers."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from dash import html

from dashboard.components import finding_card, no_data, page, table, tiles
from dashboard.data import LoadedRun
from diag.report import device_section, hta_sections
from diag.units import pct, si, size

PATH = "/"
TITLE = "Overview"


def headline(loaded: LoadedRun) -> list[tuple[str, str]]:
    summary = loaded.report["summary"]
    step_s = summary.get("step_time_s")
    items = [
        ("step time", "n/a" if step_s is None else f"{step_s * 1e3:.1f} ms"),
        ("tokens/s", si(summary.get("tokens_per_s"))),
        ("comm share (exposed)",
         f"{pct(summary.get('comm_share'))} ({pct(summary.get('exposed_comm_share'))})"),
    ]  # fmt: skip
    if summary.get("bubble_fraction") is not None:
        items.append(
            ("bubble vs theory",
             f"{pct(summary['bubble_fraction'])} vs {pct(summary.get('bubble_theory'))}")
        )  # fmt: skip
    memory = loaded.metrics.memory
    if not memory.empty:
        peak = memory[["params", "grads", "optimizer", "activations", "comm_buffers"]].sum(axis=1)
        budget = loaded.budget_bytes
        items.append(
            ("memory peak vs budget" if budget else "memory peak (measured categories)",
             f"{size(float(peak.max()))} / {size(budget)}" if budget else size(float(peak.max())))
        )  # fmt: skip
    items.append(
        ("ranks x steps", f"{summary.get('ranks_analysed')} x {summary.get('steps_analysed')}")
    )
    return items


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    findings = loaded.report["findings"]
    diagnosis = (
        [finding_card(f, first=i == 0) for i, f in enumerate(findings)]
        if findings
        else [no_data("no findings: nothing in this run crosses a rule's threshold")]
    )
    skipped = loaded.report["skipped"]
    notes = (
        [html.H3("skipped"), html.Ul([html.Li(note) for note in skipped], className="skipped")]
        if skipped
        else []
    )
    traces = [  # profiler traces: device time, and HTA's own tables with --hta
        html.Div([html.H3(s.title), table(pd.DataFrame(s.rows, columns=s.header), f"trace-{i}")])
        for i, s in enumerate([device_section(loaded.report), *hta_sections(loaded.report)])
        if s.rows
    ]
    return page(
        f"{TITLE}: {loaded.name}",
        tiles(headline(loaded)),
        html.H3("findings"),
        html.Div(diagnosis, className="findings"),
        *traces,
        *notes,
    )
