"""`diag export RUN --perfetto OUT.json.gz [--steps A:B]`: the run's timeline for Perfetto and
`chrome://tracing` (diag/outputs/perfetto.py), with the findings of the same window on the ranks
they blame."""

from __future__ import annotations

import click

from diag.api import diagnose, load_any
from diag.cli.shell import fail, parse_layout, parse_steps, project_config, rule_thresholds
from diag.contract.schema import Layout
from diag.errors import InputError
from diag.outputs.perfetto import trace_events, write_trace


@click.command()
@click.argument("path", type=click.Path(path_type=str))
@click.option(
    "--perfetto",
    "out",
    metavar="OUT.json.gz",
    required=True,
    help="Write a Chrome trace-event file (gzip when the name ends in .gz) for ui.perfetto.dev.",
)
@click.option(
    "--steps",
    metavar="A:B",
    callback=lambda _ctx, _param, value: parse_steps(value),
    help="Only steps A to B-1 (A: or :B open-ended): a long run's window keeps the file small.",
)
@click.option(
    "--layout",
    metavar="dp=N,tp=N,pp=N,ep=N,cp=N,m=N,v=N",
    callback=lambda _ctx, _param, value: parse_layout(value),
    help="How a trace folder's ranks are laid out (as for `diag analyze`).",
)
@click.option("--config", metavar="FILE", help="TOML file of rule thresholds.")
def export(
    path: str, out: str, steps: range | None, layout: Layout | None, config: str | None
) -> None:
    """Export PATH (a run directory or a folder of profiler traces) as a timeline: a process per
    rank, tracks for spans and collectives, memory counters, arrows from each collective's last
    arrival to the ranks that waited for it, and the findings on the ranks they blame."""
    try:
        source, settings = project_config(config)
        thresholds = rule_thresholds(source, settings) if source else None
        run = load_any(path, layout, steps)
        metrics, report = diagnose(run, thresholds)
        ranks = metrics.ranks
        stages = (
            {int(r): int(s) for r, s in zip(ranks["rank"], ranks["stage"], strict=True)
             if s is not None and s == s}
            if "stage" in ranks else {}
        )  # fmt: skip
        document = trace_events(run, stages, report["findings"], steps)
        write_trace(out, document)
        click.echo(f"diag: wrote {out} ({len(document['traceEvents'])} events)", err=True)
    except InputError as error:
        fail(error)
