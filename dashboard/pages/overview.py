"""Overview: the headline numbers, the diagnosis (findings ranked, main one on top, each with
what it costs the step), where the step goes (the what-if replay's waterfall), and the step time
over the steps (the findings' steps and ranks marked)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from dash import html

from dashboard import figures
from dashboard.components import finding_card, graph, no_data, page, table, tiles
from dashboard.data import LoadedRun, step_times
from diag import STOPPED_HEADER, device_section, format_metric, hta_sections, stopped_rows

PATH = "/"
TITLE = "Overview"


def headline(loaded: LoadedRun) -> list[tuple[str, str]]:
    summary, fmt = loaded.report["summary"], format_metric
    step_s = summary.get("step_time_s")
    items = [
        ("step time", "n/a" if step_s is None else f"{step_s * 1e3:.1f} ms"),
        ("tokens/s", fmt("tokens_per_s", summary.get("tokens_per_s"))),
        ("comm share (exposed)",
         f"{fmt('comm_share', summary.get('comm_share'))} "
         f"({fmt('exposed_comm_share', summary.get('exposed_comm_share'))})"),
    ]  # fmt: skip
    if summary.get("bubble_fraction") is not None:
        items.append(
            ("bubble vs theory",
             f"{fmt('bubble_fraction', summary['bubble_fraction'])} vs "
             f"{fmt('bubble_fraction', summary.get('bubble_theory'))}")
        )  # fmt: skip
    peak = loaded.peak_bytes  # the peak the memory rules hold against the budget
    if peak is not None:
        budget = loaded.budget_bytes
        items.append(
            ("memory peak vs budget" if budget else "memory peak (measured categories)",
             f"{fmt('peak_bytes', peak)} / {fmt('budget_bytes', budget)}" if budget
             else fmt("peak_bytes", peak))
        )  # fmt: skip
    items.append(
        ("ranks x steps", f"{summary.get('ranks_analysed')} x {summary.get('steps_analysed')}")
    )
    return items


def where_it_stopped(loaded: LoadedRun) -> list[Any]:
    """A run that did not finish opens with it: its status and why, the per-rank "where it
    stopped" table and the collective it stopped in; nothing for a finished or running run."""
    report = loaded.report
    rows = stopped_rows(report)
    if not rows:
        return []
    summary = report["summary"]
    parts: list[Any] = [
        html.Div(f"{str(summary.get('status')).upper()}: {summary.get('status_reason')}",
                 className="failure-status", id="overview-status"),
        html.H3("where each rank stopped"),
        table(pd.DataFrame(rows, columns=STOPPED_HEADER), "overview-stopped"),
    ]  # fmt: skip
    stuck = figures.stuck_collective(report)
    if stuck is not None:
        parts.append(graph(stuck, "overview-stuck"))
    return parts


def where_the_step_goes(loaded: LoadedRun) -> list[Any]:
    """The waterfall of the run's attribution, or a note when it has none."""
    attribution = loaded.report.get("attribution")
    if not attribution or not attribution.get("replayed_step_s"):
        return [no_data("where the step goes: no attribution (the what-if replay needs two or "
                        "more ranks with analysed steps)")]  # fmt: skip
    return [graph(figures.step_waterfall(attribution), "overview-waterfall")]


def step_time(loaded: LoadedRun) -> list[Any]:
    """The step time over the analysed steps, or a note when the run has no analysed step."""
    times = step_times(loaded)
    if times is None:
        return [no_data("step time over steps: no analysed step")]
    return [graph(figures.step_time_over_steps(times), "overview-step-time")]


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
        *where_it_stopped(loaded),
        tiles(headline(loaded)),
        html.H3("findings"),
        html.Div(diagnosis, className="findings"),
        html.H3("where the step goes"),
        *where_the_step_goes(loaded),
        html.H3("step time over steps"),
        *step_time(loaded),
        *traces,
        *notes,
    )
