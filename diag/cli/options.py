"""The command-line pieces that `diag`'s commands and `diag simulate` (simulator/cli.py) share:
the exit code and one-line message of unusable input, and the `--layout` parser. It imports
neither the CLI nor the analysis, so the simulator's command can use it without importing
`diag.cli.main` back."""

from __future__ import annotations

from typing import Any, NoReturn

import click

from diag.contract import schema
from diag.errors import InputError
from diag.outputs.escape import terminal

EXIT_INPUT = 2


def fail(error: InputError) -> NoReturn:
    """Print `diag: error: PATH: reason` on stderr and exit 2."""
    click.echo(terminal(f"diag: error: {error}"), err=True)  # one line, whatever the names hold
    raise SystemExit(EXIT_INPUT)


_LAYOUT_KEYS = {"dp": "dp", "tp": "tp", "pp": "pp", "ep": "ep", "cp": "cp", "m": "microbatches",
                "microbatches": "microbatches", "v": "virtual_stages",
                "virtual_stages": "virtual_stages", "zero": "zero_stage",
                "zero_stage": "zero_stage", "ga": "grad_accum",
                "grad_accum": "grad_accum"}  # fmt: skip


def parse_layout(text: str | None) -> schema.Layout | None:
    """`dp=8,tp=2,pp=4,m=16[,v=2][,zero=3][,ga=4]` -> Layout; click.BadParameter (exit 2)
    naming what is off. m, v and ga not given are 0, zero not given NOT_GIVEN_ZERO: a trace
    folder reads them from its traces where they say them (diag/read/kineto/schedule.py,
    sharding.py), else they are unknown, never a default."""
    if not text:
        return None
    values: dict[str, Any] = {"microbatches": 0, "virtual_stages": 0, "grad_accum": 0,
                              "zero_stage": schema.NOT_GIVEN_ZERO}  # fmt: skip
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, raw = item.partition("=")
        field = _LAYOUT_KEYS.get(key.strip())
        if field is None:
            raise click.BadParameter(
                f"unknown dimension {key.strip()!r} in {text!r}; expected "
                "dp, tp, pp, ep, cp, m (micro-batches), v (virtual stages), zero (the ZeRO "
                "stage), ga (gradient accumulation)"
            )
        try:
            values[field] = int(raw)
        except ValueError:
            raise click.BadParameter(f"{key.strip()}={raw!r} is not a whole number") from None
        if field == "zero_stage" and not 0 <= values[field] <= 3:
            raise click.BadParameter(f"{key.strip()}={raw}: the ZeRO stage is 0, 1, 2 or 3")
        if field != "zero_stage" and values[field] < 1:
            raise click.BadParameter(f"{key.strip()}={raw} must be at least 1")
    return schema.Layout(**values)
