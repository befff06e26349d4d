"""The `diag` command line: a thin shell over the public API (load -> metrics -> report).

`main` is a click group whose commands, defined in other modules, are imported when named
(`_COMMANDS_ELSEWHERE`): `diag analyze` does not import the planner, the simulator or the watcher,
and `diag plan` not the analysis. Exit codes (docs/cli.md, "Exit codes"): 0 success, 2 unusable
input or arguments with one line `diag: error: PATH: reason` on stderr, never a traceback.
"""

from __future__ import annotations

import atexit
import gc
import importlib

import click

from diag import __version__

atexit.register(gc.freeze)
"""At exit every object is moved out of the cycle collector's reach: the interpreter's last
collections would otherwise walk every object of pandas, numba and the run once more (half a
second after a large analysis), only to free memory the process is about to give back."""

_COMMANDS_ELSEWHERE = {
    "analyze": "diag.cli.analyze:analyze",
    "dashboard": "diag.cli.analyze:dashboard",
    "check": "diag.cli.check:check",
    "compare": "diag.cli.compare:compare",
    "convert": "diag.cli.convert:convert",
    "demo": "diag.cli.launch:demo",
    "export": "diag.cli.export:export",
    "plan": "diag.cli.plan:plan",
    "rules": "diag.cli.rules:rules",
    "run": "diag.cli.launch:run",
    "simulate": "simulator.cli:simulate",
    "watch": "diag.cli.watch:watch_command",
}
"""The commands other modules define (name -> module:attribute), imported when named or listed."""


class _Commands(click.Group):
    """A group that imports the commands of `_COMMANDS_ELSEWHERE` on first use: each command
    pays for its own imports only (pandas and the analysis are 0.7 s that `diag plan` or
    `diag run` would pay for nothing)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS_ELSEWHERE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS_ELSEWHERE:
            module, attribute = _COMMANDS_ELSEWHERE[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="diag")
def main() -> None:
    """Diagnose distributed training runs: what is slow, why, and what to change."""


__all__ = ["main"]
