"""What a counterfactual of the attribution removes (`CauseKind`), what removing it saves
(`Cause`), and the attribution of a run (`Attribution`): the causes the report lists by cost
and the rules' costs are read from (diag/rules/costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pandas as pd

NS_PER_S = 1e9
QUEUED_SAID_SHARE = 0.05
"""The share of a straggler's excess its extra waiting for a core must reach to be said."""


class CauseKind(StrEnum):
    """What a counterfactual removes (the report writes the value)."""

    STRAGGLER = "straggler"  # a rank's persistent excess of compute
    HOST = "host"  # a rank's persistent excess of host time (in no record)
    IMBALANCE = "imbalance"  # every rank's local time at its peers' median in every step
    STAGE = "stage"  # a pipeline stage's excess over the other stages
    TRANSFER = "transfer"  # a group's transfers at zero
    SCHEDULE = "schedule"  # the pipeline's schedule at its ideal bubble
    DESCHEDULED = "descheduled"  # the time ranks waited for a core
    UNTRACED = "untraced"  # traced ranks waiting in collectives for members nobody traced


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


@dataclass
class Attribution:
    """The step of a run, attributed: the measured and replayed step, the causes by cost, and
    per rank and group the split of waiting into arrival skew and transfer."""

    measured_step_s: float
    replayed_step_s: float
    replay_error: float
    steps_replayed: int
    causes: list[Cause]
    ideal_step_s: float
    all_transfers_s: float
    """What every transfer at zero saves at once (the communication findings' cost)."""
    balanced_s: float
    """What every rank's local time at its peers' median in every step saves: all imbalance,
    persistent and random."""
    waits: pd.DataFrame
    """rank, group, skew_s, transfer_s (per step), last_share (of its group's collectives
    that this rank arrived at last)."""
    notes: list[str] = field(default_factory=list)
    gaps: pd.DataFrame = field(default_factory=pd.DataFrame)
    """rank, waiting_s, own_s: per step, the rank's time in no record right before a blocking
    event, read as waiting for a dependency or as its own host time (docs/metrics.md,
    "Dependencies")."""
    ambiguous: pd.DataFrame = field(default_factory=pd.DataFrame)
    """rank, before, gap_s: per step, the time in gaps this attribution reads as the rank's own
    though the evidence does not decide (its group's ranks resumed closer together than they
    arrived, not together: diag/whatif/untraced.py), by what the gap ended at."""
    transfers_if_untraced_waited_s: float | None = None
    """What every transfer at zero saves where the collectives of groups with untraced members
    that no faster collective bounds are read as waiting for those members, not as transfer
    (diag/whatif/late_members.py): the low end of the transfers' cost; None where none is."""
    untraced_unsure_ranks: list[int] = field(default_factory=list)
    """The untraced members those collectives may have waited for."""
    alternative: Attribution | None = None
    """The attribution with those gaps read as waiting in a synchronisation of their group
    (None where no gap's reading is ambiguous): the other end of every cost's range."""

    def cause(self, kind: CauseKind, **match: Any) -> Cause | None:
        for cause in self.causes:
            if cause.kind == kind and all(getattr(cause, k) == v for k, v in match.items()):
                return cause
        return None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "measured_step_s": self.measured_step_s,
            "replayed_step_s": self.replayed_step_s,
            "replay_error": self.replay_error,
            "steps_replayed": self.steps_replayed,
            "ideal_step_s": self.ideal_step_s,
            "all_transfers_s": self.all_transfers_s,
            "balanced_s": self.balanced_s,
            "causes": [vars(c) for c in self.causes],
            "waits": self.waits.to_dict("records"),
            "gaps": self.gaps.to_dict("records"),
            "notes": self.notes,
        }
        if self.alternative is not None:  # only then: the report of every other run as it was
            out["causes"] = cause_ranges(self.causes, self.alternative.causes)
            out["ambiguous_gaps"] = self.ambiguous.to_dict("records")
            out["ideal_step_range_s"] = sorted([self.ideal_step_s, self.alternative.ideal_step_s])
        return out


def cause_key(cause: Cause) -> tuple[Any, ...]:
    """One counterfactual across the readings: a rank's excess is one whether the replay
    calls it compute or host time in either."""
    family = "rank" if cause.kind in (CauseKind.STRAGGLER, CauseKind.HOST) else cause.kind
    return (family, tuple(cause.ranks), cause.stage, cause.group)


def cause_ranges(causes: list[Cause], other: list[Cause]) -> list[dict[str, Any]]:
    """The causes as the report writes them, each with `cost_range_s`: its cost in this
    reading and in the `other` (0 where that reading did not find it), lower first; then the
    causes only the other reading found, their cost here 0."""
    theirs = {cause_key(c): c for c in other}
    ours = {cause_key(c) for c in causes}
    out = []
    for cause in causes:
        found = theirs.get(cause_key(cause))
        cost = 0.0 if found is None else found.cost_s
        out.append(vars(cause) | {"cost_range_s": sorted([cause.cost_s, cost])})
    for cause in other:
        if cause_key(cause) not in ours:
            out.append(vars(cause) | {"cost_s": 0.0, "cost_share": 0.0,
                                      "cost_range_s": [0.0, cause.cost_s]})  # fmt: skip
    return out


def straggler_explained(excess_ns: float, saved_ns: float, queued_ns: float = 0.0) -> str:
    """A straggler's evidence in words: its excess per step (and the part of it that was its
    extra waiting for a core, where recorded: the host's, not the rank's own work) and what
    of it reaches the end."""
    queued = ""
    if queued_ns >= QUEUED_SAID_SHARE * excess_ns and queued_ns > 0:
        own_ns = max(excess_ns - queued_ns, 0.0)
        queued = f" ({own_ns / 1e6:.1f} ms its own, {queued_ns / 1e6:.1f} ms waiting for a core)"
    return (
        f"{excess_ns / 1e6:.1f} ms more local time per step than its peers{queued}; "
        f"{saved_ns / 1e6:.1f} ms of it reaches the step's end, the rest is absorbed "
        "where the rank or its peers would wait anyway (on other ranks, transfers, "
        "the pipeline's bubble)"
    )


def imbalance_explained(random_ns: float, if_noise_ns: float) -> str:
    """Random imbalance's evidence in words: what balancing saves, and the noise bound."""
    return (
        f"balancing the work across each stage's ranks saves {random_ns / 1e6:.1f} ms per "
        f"step; if the variation is noise rather than work (interrupts, other processes, "
        f"pauses), removing it saves up to {if_noise_ns / 1e6:.1f} ms"
    )
