"""`diag convert RUN --to arrow|jsonl`: rewrite a run directory's rank files in the other format
(diag/rankfile/convert.py)."""

from __future__ import annotations

from pathlib import Path

import click

from diag.cli.options import fail
from diag.errors import InputError
from diag.outputs.escape import terminal
from diag.rankfile.convert import TARGETS, convert_run


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--to", "to", type=click.Choice(sorted(TARGETS)), required=True,
    help="The format to write: Arrow IPC streams (.arrows) or JSON lines (.jsonl).",
)  # fmt: skip
def convert(run_dir: Path, to: str) -> None:
    """Rewrite RUN_DIR's rank files as Arrow IPC streams or JSON lines (docs/run-format.md)."""
    try:
        converted, notes = convert_run(run_dir, to)
    except InputError as err:
        fail(err)
    except OSError as err:
        fail(InputError(run_dir, f"cannot write ({err.strerror or err})"))
    for note in notes:
        click.echo(terminal(f"diag: note: {note}"), err=True)
    click.echo(terminal(f"converted {converted} rank files of {run_dir} to {to}"))
