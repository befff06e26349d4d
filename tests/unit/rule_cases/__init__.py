"""Rule test cases as data: for every rule, a run that triggers it and one that must not.

Each family module defines `CASES: list[RuleCase]`; `build(runs)` writes a small run directory
with the `runs` fixture's RunWriter (tests/conftest.py) and returns its path.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diag.rules.families as rule_families


@dataclass(frozen=True)
class RuleCase:
    code: str  # the rule under test
    triggers: bool  # must the rule fire on this run?
    build: Callable[[Any], Path]  # RunWriter -> run directory
    why: str  # one line: what the run shows
    ranks: tuple[int, ...] | None = None  # when it triggers: the ranks the finding must blame
    severity: str | None = None  # when it triggers: the severity the finding must have


def all_cases() -> list[RuleCase]:
    """The cases of every rule family: one module here for each module of
    diag/rules/families (a family without its case module fails to import)."""
    names = sorted(m.name for m in pkgutil.iter_modules(rule_families.__path__))
    families = [importlib.import_module(f"rule_cases.{name}") for name in names]
    return [case for family in families for case in family.CASES]
