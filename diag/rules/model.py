"""What a rule produces (`Finding`) and how its thresholds are declared (`Threshold`): the
shapes the engine, the rule families and the cost policy (diag/rules/costs.py) share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class Threshold:
    default: float
    unit: str  # e.g. "fraction", "ratio", "s", "bytes", "steps"
    help: str  # one line: what crossing it means


@dataclass(kw_only=True)
class Finding:
    """What a rule found. A rule fills in the content; `rule` and `pattern` are stamped by the
    engine from the rule's registration (`@rule(code, name, pattern)`), so they cannot disagree."""

    rule: str = ""  # the rule's code, e.g. "PP001"
    pattern: int | None = None  # collapse pattern 1-5, None for a configuration pitfall
    severity: str  # high | medium | low
    title: str  # one line a person reads first
    ranks: list[int] = field(default_factory=list)  # the ranks to blame, when some are
    evidence: dict[str, Any] = field(default_factory=dict)  # the numbers that prove it
    advice: str = ""  # what to change
    margin: float | None = None  # evidence / its high threshold; ranks equal severities (None: 1)
    explains: list[str] = field(default_factory=list)  # codes of findings this one is the cause of
    cost_s: float | None = (
        None  # step time (s per step) removing the cause saves (diag.rules.costs)
    )
    cost_share: float | None = None  # cost_s over the measured step
    cost_range_s: list[float] | None = None
    """[low, high]: cost_s in the two readings of gaps whose reading is ambiguous (as the
    rank's own time, as waiting); None where none is, or the finding's cost is the same in
    both (the report then writes no range)."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")


def grade(value: float | None, limits: Mapping[str, float]) -> str | None:
    """The severity of `value` against a rule's `medium` and `high` thresholds (None below)."""
    if value is None or value < limits["medium"]:
        return None
    return "high" if value >= limits["high"] else "medium"
