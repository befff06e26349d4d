"""Helpers shared by the CLI's commands: reading a TOML config, the rule thresholds, the `--steps`
window; and, from diag/cli/options.py, the one-line fatal error and `--layout`."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import click

from diag.cli.options import EXIT_INPUT, fail, parse_layout
from diag.contract.files import read_regular
from diag.contract.limits import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH
from diag.errors import InputError
from diag.read.load import OPEN_END
from diag.rules import check_config

__all__ = [
    "EXIT_INPUT",
    "fail",
    "parse_layout",
    "parse_steps",
    "project_config",
    "read_config",
    "rule_thresholds",
]


def read_config(path: str) -> dict[str, Any]:
    """Parse a TOML config file (rule thresholds); raises InputError if missing or invalid,
    too large or nested deeper than thresholds are (diag/contract/limits.py)."""
    try:
        config = tomllib.loads(read_regular(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except IsADirectoryError:
        raise InputError(path, "is a directory, not a TOML file") from None
    except OSError as err:
        raise InputError(path, f"cannot read ({err.strerror or err})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InputError(path, f"not valid TOML ({err})") from None
    except RecursionError:
        raise InputError(path, "not valid TOML (nested too deeply to parse)") from None
    if nesting(config) > MAX_CONFIG_DEPTH:
        raise InputError(path, f"nested deeper than {MAX_CONFIG_DEPTH} levels (thresholds are two)")
    return config


def nesting(value: Any) -> int:
    """How deeply tables and arrays nest in a parsed file, counted without recursion."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            deepest = max(deepest, level + 1)
            pending.extend((child, level + 1) for child in children)
    return deepest


def project_config(config: str | None) -> tuple[str | None, dict[str, Any]]:
    """The settings to use and where they came from: the `--config` file when given, else the
    `[tool.diag]` table of ./pyproject.toml when there is one, else nothing."""
    if config is not None:
        return config, read_config(config)
    pyproject = Path("pyproject.toml")
    if pyproject.is_file():
        table = read_config(str(pyproject)).get("tool", {}).get("diag")
        if isinstance(table, dict):
            return f"{pyproject} [tool.diag]", table
    return None, {}


def rule_thresholds(path: str, config: dict[str, Any]) -> dict[str, Any]:
    """The `[rules]` table of a parsed config, checked against the registry (InputError if a
    rule or threshold is unknown): `[rules.CODE]` or `[rules."dotted.name"]` tables."""
    thresholds = config.get("rules", {})
    if not isinstance(thresholds, dict):
        raise InputError(path, "[rules] must be a table of [rules.CODE] tables")
    try:
        check_config(thresholds)
    except ValueError as err:
        raise InputError(path, str(err)) from None
    return thresholds


def parse_steps(text: str | None) -> range | None:
    """`A:B` (steps A to B-1), `A:` (from A) or `:B` -> range; click.BadParameter (exit 2)."""
    if not text:
        return None
    first, colon, last = text.partition(":")
    if not colon:
        raise click.BadParameter(f"{text!r} is not a window A:B (steps A to B-1)")
    try:
        start = int(first) if first.strip() else 0
        stop = int(last) if last.strip() else OPEN_END
    except ValueError:
        raise click.BadParameter(f"{text!r}: A and B must be whole numbers") from None
    if start < 0 or stop <= start:
        raise click.BadParameter(f"{text!r}: need 0 <= A < B")
    return range(start, stop)
