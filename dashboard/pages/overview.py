"""Overview: the run's status (and, for a job that did not finish, where each rank stopped), the
verdict (the findings as cards coloured by severity, the main one on top, each with who, what it
costs and the fix), the run's facts (ranks, layout and where it came from, the step, MFU,
status), then the evidence: where the step goes (the what-if replay, each cause measured alone
against the ideal step, the overlap said in words) and the step time over the steps (the
findings' steps and ranks marked)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from dash import html

from dashboard import figures
from dashboard.components import facts, finding_card, graph, healthy_card, no_data, page, table
from dashboard.data import LoadedRun, step_times
from diag import (
    attribution_words,
    device_section,
    did_not_finish,
    failure_rows,
    format_metric,
    hta_sections,
    run_status,
    status_words,
    summary_items,
    verdicts,
)

PATH = "/"
TITLE = "Overview"


def headline(loaded: LoadedRun) -> list[tuple[str, str]]:
    """The run's facts (`diag.summary_items`) and its memory peak, before the status."""
    items = summary_items(loaded.report)
    fmt = format_metric
    peak = loaded.peak_bytes  # the peak the memory rules hold against the budget
    if peak is not None:
        budget = loaded.budget_bytes
        items.insert(
            len(items) - 1,
            ("memory peak vs budget" if budget else "memory peak (measured categories)",
             f"{fmt('peak_bytes', peak)} / {fmt('budget_bytes', budget)}" if budget
             else fmt("peak_bytes", peak)),
        )  # fmt: skip
    return items


def status(loaded: LoadedRun) -> list[Any]:
    """The slot at the top: the run's status, and for a job that did not finish an alert and
    where each rank stopped (`diag.failure_rows`)."""
    report = loaded.report
    failed = did_not_finish(report)
    badge = html.Span(
        f"status: {run_status(report)}", id="run-status",
        className="status failed" if failed else "status",
    )  # fmt: skip
    header, rows = failure_rows(report)
    out: list[Any] = [badge]
    if failed or rows:
        out.append(html.Div(
            [html.Strong("The job did not finish"),
             f" ({status_words(report)}): the findings below it are of the steps before it "
             "stopped."], className="alert", id="failure",
        ))  # fmt: skip
    if rows:
        out += [html.H3("where each rank stopped"),
                table(pd.DataFrame(rows, columns=header), "overview-stopped")]  # fmt: skip
    stuck = figures.stuck_collective(report)
    if stuck is not None:  # the collective the ranks were left waiting in
        out.append(graph(stuck, "overview-stuck"))
    return out


def where_the_step_goes(loaded: LoadedRun) -> list[Any]:
    """The chart of the run's attribution and its words, or a note when it has none."""
    attribution = loaded.report.get("attribution")
    if not attribution or not attribution.get("replayed_step_s"):
        return [no_data("where the step goes: no attribution (the what-if replay needs two or "
                        "more ranks with analysed steps)")]  # fmt: skip
    return [graph(figures.step_waterfall(attribution), "overview-waterfall"),
            html.P(attribution_words(attribution), className="chart-note")]  # fmt: skip


def step_time(loaded: LoadedRun) -> list[Any]:
    """The step time over the analysed steps, or a note when the run has no analysed step."""
    times = step_times(loaded)
    if times is None:
        return [no_data("step time over steps: no analysed step")]
    return [graph(figures.step_time_over_steps(times), "overview-step-time")]


def layout(loaded: LoadedRun, runs: Sequence[LoadedRun]) -> html.Div:
    found = verdicts(loaded.report)
    diagnosis = [finding_card(v, first=i == 0) for i, v in enumerate(found)] or [healthy_card()]
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
        html.Div(status(loaded), className="status-slot"),
        html.H3("findings"),
        html.Div(diagnosis, className="findings cards"),
        html.H3("the run"),
        facts(headline(loaded)),
        html.H3("where the step goes"),
        *where_the_step_goes(loaded),
        html.H3("step time over steps"),
        *step_time(loaded),
        *traces,
        *notes,
    )
