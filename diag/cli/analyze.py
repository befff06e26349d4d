"""`diag analyze` and `diag dashboard`: the report of a run directory or a trace folder in a
terminal, a file or a browser (imported when named: `diag plan`, `diag run` and the others do
not load pandas and the analysis for nothing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from diag.api import analyze_path, diagnose, load_any
from diag.cli.shell import (
    fail,
    parse_layout,
    parse_steps,
    project_config,
    rule_thresholds,
)
from diag.contract.schema import Layout
from diag.errors import InputError
from diag.metrics import flops
from diag.outputs.html_charts import Chart
from diag.outputs.report import render_html, render_markdown, render_text
from diag.read.memory_budget import parse_size, use_budget
from diag.read.parallel import use_scheduler

FORMATS: dict[str, Callable[[dict[str, Any]], str]] = {
    "text": render_text,
    "json": lambda report: json.dumps(report, indent=2, allow_nan=False) + "\n",
    "markdown": render_markdown,
    "html": render_html,
}
_FORMAT_BY_SUFFIX = {".json": "json", ".md": "markdown", ".markdown": "markdown",
                     ".html": "html", ".htm": "html", ".txt": "text"}  # fmt: skip


def write_output(path: str, text: str) -> None:
    """Write the report to `path`; raises InputError if it cannot be written."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as err:
        raise InputError(path, f"cannot write ({err.strerror or err})") from None


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    default=None,
    help="Report format [default: text, or from the --out suffix: .json .md .html].",
)
@click.option("--out", metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option(
    "--config",
    metavar="FILE",
    help="TOML file of rule thresholds [default: [tool.diag] in ./pyproject.toml].",
)
@click.option(
    "--hta", is_flag=True, help="Add HTA's analyses of the profiler traces (slow: HTA re-parses)."
)
@click.option(
    "--layout",
    metavar="dp=N,tp=N,pp=N,ep=N,cp=N,m=N,v=N",
    callback=lambda _ctx, _param, value: parse_layout(value),
    help="How a trace folder's ranks are laid out (grid order, tp innermost; m micro-batches, "
    "v virtual stages, read from the traces where not given): stages and the bubble against "
    "theory.",
)
@click.option(
    "--steps",
    metavar="A:B",
    callback=lambda _ctx, _param, value: parse_steps(value),
    help="Analyse only steps A to B-1 of a run directory (A: or :B open-ended): a long run's "
    "window in the memory of the window.",
)
@click.option(
    "--model",
    metavar="layers=N,hidden=N,seq=N,vocab=N",
    callback=lambda _ctx, _param, value: _model_spec(value),
    help="The model, for MFU (a trace folder has none; over a run's manifest it overrides): "
    "also heads, ffn, experts, topk, and batch (sequences per micro-batch, for a trace's tokens).",
)
@click.option(
    "--peak-tflops",
    type=click.FloatRange(min=0, min_open=True),
    help="One device's peak TFLOP/s for MFU [default: the device table, bf16 dense].",
)
@click.option(
    "--replay",
    type=click.Choice(["budget", "all"]),
    default="budget",
    show_default=True,
    help="Steps the attribution replays: every step in memory within a budget of events, else "
    "the first ones (budget), or every analysed step, in chunks (all: a large run's rank "
    "files are read again; docs/scale.md).",
)
@click.option(
    "--scheduler",
    metavar="tcp://HOST:8786",
    help="Parse the rank files or traces on this Dask cluster [default: $DASK_SCHEDULER_ADDRESS,"
    " else local processes]; its workers must see PATH at the same path.",
)
@click.option(
    "--memory-budget",
    metavar="SIZE",
    callback=lambda _ctx, _param, value: _memory_size(value),
    help="Memory the analysis may hold, every process together (e.g. 2GiB): traces are parsed "
    "as many at once as fit it [default: $DIAG_MEMORY_BUDGET, else 3/4 of the available].",
)
def analyze(
    path: str,
    fmt: str | None,
    out: str | None,
    config: str | None,
    hta: bool,
    layout: Layout | None,
    steps: range | None,
    model: str | None,
    peak_tflops: float | None,
    replay: str,
    scheduler: str | None,
    memory_budget: int | None,
) -> None:
    """Analyse PATH, a run directory or a folder of PyTorch profiler traces, and report
    busy/comm/idle, bytes, memory and experts with the findings."""
    use_scheduler(scheduler)
    use_budget(memory_budget)
    try:
        source, settings = project_config(config)
        thresholds = rule_thresholds(source, settings) if source else None
        if fmt is None:
            fmt = _FORMAT_BY_SUFFIX.get(Path(out).suffix.lower(), "text") if out else "text"
        if fmt == "html":
            overrides = (model, peak_tflops)
            text = html_report(path, thresholds, hta, layout, steps, overrides, replay == "all")
        else:
            report = analyze_path(path, thresholds, hta=hta, layout=layout, steps=steps,
                                  replay_all=replay == "all")  # fmt: skip
            text = FORMATS[fmt](flops.with_overrides(report, model, peak_tflops))
        if out is None:
            click.echo(text, nl=False)
        else:
            write_output(out, text)
            click.echo(f"diag: wrote {out}", err=True)
    except InputError as error:
        fail(error)


def html_report(
    path: str,
    thresholds: dict[str, Any] | None,
    hta: bool,
    layout: Layout | None,
    steps: range | None,
    overrides: tuple[str | None, float | None] = (None, None),
    replay_all: bool = False,
) -> str:
    """The HTML report with the dashboard's figures (dashboard/html_report.py): the run is
    loaded and diagnosed here, since the figures need its tables, not only the report dict.
    `overrides`: `--model` and `--peak-tflops` for MFU."""
    from dashboard.html_report import plotly_js_gzip, report_charts  # plotly, not Dash

    run = load_any(path, layout, steps)
    metrics, report = diagnose(run, thresholds, hta, replay_all)
    report = flops.with_overrides(report, *overrides)
    charts = [Chart(section, figure) for section, figure in report_charts(run, metrics, report)]
    return render_html(report, charts, plotly_js_gzip())


def _memory_size(text: str | None) -> int | None:
    """`--memory-budget` in bytes, checked here (exit 2 naming the bad size)."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _model_spec(text: str | None) -> str | None:
    """`--model` checked here (exit 2 naming the bad key), applied after the analysis."""
    if text is not None:
        try:
            flops.parse_model(text)
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return text


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(0, 65535))
@click.option("--config", metavar="FILE", help="TOML file of rule thresholds.")
@click.option("--hta", is_flag=True, help="Add HTA's analyses of the runs' profiler traces.")
@click.option(
    "--live", is_flag=True, help="Follow runs still being written: re-read and redraw every 2 s."
)
def dashboard(
    paths: tuple[str, ...], host: str, port: int, config: str | None, hta: bool, live: bool
) -> None:
    """Serve the Dash dashboard over the run directories PATHS (bubbles, stragglers, bytes,
    memory, expert load, comparison). Only these runs are served."""
    from dashboard.app import serve  # Dash is imported only for this command

    try:
        source, settings = project_config(config)
        thresholds = rule_thresholds(source, settings) if source else None
        serve(list(paths), host, port, thresholds, hta, 2.0 if live else None)
    except InputError as error:
        fail(error)


__all__ = ["FORMATS", "analyze", "dashboard", "html_report", "write_output"]
