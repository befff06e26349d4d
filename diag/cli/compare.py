"""`diag compare`: runs side by side; a scaling sweep or a before/after pair read for its verdict.

- A **scaling sweep** (same model, every run a different world size): the throughput of each
  step up in ranks and its scaling efficiency, (tokens/s_B / tokens/s_A) / (world_B / world_A).
  Throughput that falls as GPUs are added is direct evidence of collapse pattern 1.
- A **before/after** set (same world size): each later run against the first, listing the
  metrics that got worse by more than the tolerance (relative).
`compare_reports` (diag/outputs/compare.py) is pure; this command reads the runs and renders it.
"""

from __future__ import annotations

import json

import click

from diag.api import analyze_path
from diag.cli.shell import fail
from diag.errors import InputError
from diag.outputs.compare import DEFAULT_TOLERANCE, compare_reports, render_compare_text


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--tolerance",
    type=float,
    default=DEFAULT_TOLERANCE,
    show_default=True,
    help="Relative change that counts as a regression in a before/after set.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def compare(paths: tuple[str, ...], tolerance: float, fmt: str) -> None:
    """Compare runs side by side: a scaling sweep (same model, different world sizes) or a
    before/after set (same world size; the first run is the baseline)."""
    if len(paths) < 2:
        raise click.UsageError("compare needs at least two runs")
    if tolerance < 0:
        raise click.UsageError(f"--tolerance must be >= 0, got {tolerance}")
    try:
        labelled = [(path, analyze_path(path)) for path in paths]
    except InputError as error:
        fail(error)
    result = compare_reports(labelled, tolerance)
    if fmt == "json":
        click.echo(json.dumps(result, indent=2, allow_nan=False))
    else:
        click.echo(render_compare_text(result), nl=False)
