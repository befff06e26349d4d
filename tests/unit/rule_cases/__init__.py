"""Rule test cases as data: for every rule, a run that triggers it and one that must not.

Each family module defines `CASES: list[RuleCase]`; `build(runs)` writes a small run directory
with the `runs` fixture's RunWriter (tests/conftest.py) and returns its path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RuleCase:
    code: str  # the rule under test
    triggers: bool  # must the rule fire on this run?
    build: Callable[[Any], Path]  # RunWriter -> run directory
    why: str  # one line: what the run shows
    ranks: tuple[int, ...] | None = None  # when it triggers: the ranks the finding must blame
    severity: str | None = None  # when it triggers: the severity the finding must have


def all_cases() -> list[RuleCase]:
    from rule_cases import (
        balance,
        communication,
        lost_time,
        memory,
        moe,
        pipeline,
        pitfalls,
        topology,
        trend,
    )  # fmt: skip

    families = (
        balance, communication, lost_time, memory, moe, pipeline, pitfalls, topology, trend,
    )  # fmt: skip
    return [case for family in families for case in family.CASES]
