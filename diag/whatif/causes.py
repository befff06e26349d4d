"""What a counterfactual of the attribution removes (`CauseKind`) and what removing it saves
(`Cause`): the causes the report lists by cost and the rules' costs are read from
(diag/rules/costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class CauseKind(StrEnum):
    """What a counterfactual removes (the report writes the value)."""

    STRAGGLER = "straggler"  # a rank's persistent excess of compute
    HOST = "host"  # a rank's persistent excess of host time (in no record)
    IMBALANCE = "imbalance"  # every rank's local time at its peers' median in every step
    STAGE = "stage"  # a pipeline stage's excess over the other stages
    TRANSFER = "transfer"  # a group's transfers at zero
    SCHEDULE = "schedule"  # the pipeline's schedule at its ideal bubble
    DESCHEDULED = "descheduled"  # the time ranks waited for a core


@dataclass
class Cause:
    """One counterfactual: what it changes, and the step time it saves (s per step)."""

    kind: CauseKind
    label: str
    cost_s: float
    cost_share: float
    ranks: list[int] = field(default_factory=list)
    stage: int | None = None
    group: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
