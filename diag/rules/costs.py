"""What a finding costs: the step time the counterfactual that removes its cause saves
(diag/whatif), attached to every time finding; and the severity that cost earns.

Policy (docs/rules.md, "Ranking"): findings of collapse patterns 1-3 whose cause the replay can
remove carry `cost_s` (per step) and `cost_share` (of the measured step), and their severity is
the lower of what the rule's evidence grades and what the cost's share of the step earns:
`high` from 25%, `medium` from 10%, `low` below (configurable as the `[cost]` table).
Communication findings claim only transfer time; waiting for a late peer is the late rank's,
stage's or the data's.

Where the evidence leaves some gaps' reading ambiguous (time in no record that may be the
rank's own work or waiting for a peer: diag/whatif/untraced.py), the replay gives a cost in
each reading and the finding carries both as `cost_range_s` (`cost_s` is the first reading's,
the gaps as the rank's own); the cost lowers a severity then only as far as the higher end
allows, since the lower end may be the reading that is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from diag.outputs.units import ranks_phrase
from diag.rules.model import Finding, Threshold
from diag.whatif.attribution import Attribution
from diag.whatif.causes import CauseKind

COST_TABLE = "cost"
COST_LIMITS = {
    "high": Threshold(0.25, "fraction", "share of the step a finding costs: high"),
    "medium": Threshold(0.10, "fraction", "share of the step a finding costs: medium"),
}
TIME_PATTERNS = frozenset({1, 2, 3})
STRAGGLER_CAUSES = (CauseKind.STRAGGLER, CauseKind.HOST)
"""The replay's causes that are one rank's persistent excess (BAL001's and BAL003's cost)."""
SEVERITY_ORDER = ("high", "medium", "low")


def ranks_cost_s(attribution: Attribution, ranks: list[int], kinds: tuple[CauseKind, ...]) -> float:
    """The cost of removing the persistent excess of `ranks` (their causes of these kinds,
    summed); 0 when none of them is a cause the replay found."""
    return sum(c.cost_s for c in attribution.causes
               if c.kind in kinds and set(c.ranks) & set(ranks))  # fmt: skip


def _ranks(kinds: tuple[CauseKind, ...]) -> Callable[[Finding, Attribution], float | None]:
    def cost(finding: Finding, attribution: Attribution) -> float | None:
        return ranks_cost_s(attribution, finding.ranks, kinds)

    return cost


def _busy_cost_s(finding: Finding, attribution: Attribution) -> float | None:
    return busy_cost_s(attribution, finding.ranks)


def busy_cost_s(attribution: Attribution, ranks: list[int]) -> float:
    """BAL001's cost: what removing the ranks' excess of busy time saves. Where the replay
    found a rank's excess mostly host time (a HOST cause: BAL005 names it, with the whole
    saving), only the part its compute at the peers' median saves is the busy time's; the
    whole saving claimed twice made a few ms of compute noise beside a 100 ms data fetch rank
    level with the fetch."""
    total = 0.0
    for cause in attribution.causes:
        if not set(cause.ranks) & set(ranks):
            continue
        if cause.kind == CauseKind.STRAGGLER:
            total += cause.cost_s
        elif cause.kind == CauseKind.HOST:
            compute_s = cause.evidence.get("compute_saving_s")
            total += cause.cost_s if compute_s is None else min(float(compute_s), cause.cost_s)
    return total


def _transfer(*groups: str) -> Callable[[Finding, Attribution], float | None]:
    def cost(finding: Finding, attribution: Attribution) -> float | None:
        wanted = set(groups) or None
        found = [c.cost_s for c in attribution.causes if c.kind == CauseKind.TRANSFER
                 and (wanted is None or c.group in wanted)]  # fmt: skip
        if wanted is None:
            return _net_of_host(attribution.all_transfers_s, attribution)
        return sum(found)

    return cost


def _net_of_host(transfers_s: float, attribution: Attribution) -> float:
    """What the transfers cost once every rank had its cores: on an oversubscribed host the
    collectives' threads wait for a core, and that time is the host's (HST001), not theirs."""
    host = attribution.cause(CauseKind.DESCHEDULED)
    beyond = None if host is None else host.evidence.get("transfers_with_cores_s")
    return transfers_s if beyond is None else min(transfers_s, float(beyond))


def _kind(kind: CauseKind) -> Callable[[Finding, Attribution], float | None]:
    def cost(finding: Finding, attribution: Attribution) -> float | None:
        cause = attribution.cause(kind)
        return 0.0 if cause is None else cause.cost_s

    return cost


def _stage(finding: Finding, attribution: Attribution) -> float | None:
    return sum(c.cost_s for c in attribution.causes
               if c.kind == CauseKind.STAGE and set(c.ranks) & set(finding.ranks))  # fmt: skip


COSTS: dict[str, Callable[[Finding, Attribution], float | None]] = {
    "BAL001": _busy_cost_s,
    "BAL003": _ranks(STRAGGLER_CAUSES),
    "BAL005": _ranks((CauseKind.HOST,)),
    "BAL006": _ranks((CauseKind.UNTRACED,)),
    "BAL002": lambda finding, attribution: attribution.balanced_s,
    "BAL004": _kind(CauseKind.IMBALANCE),
    "COM001": _transfer(),
    "COM002": _transfer("tp"),
    "COM003": _transfer("dp"),
    "PIP002": _kind(CauseKind.SCHEDULE),
    "PIP003": _stage,
    "HST001": _kind(CauseKind.DESCHEDULED),
}
"""Which counterfactual each time finding's cause is."""


def attach_costs(
    findings: list[Finding],
    attribution: Attribution | None,
    config: Mapping[str, Any] | None,
    rule_limits: Mapping[str, Mapping[str, float]] | None = None,
) -> None:
    """Give each time finding its cost and the severity the cost earns (in place: the
    findings are the engine's own, just made). A rule whose own `high` and `medium`
    thresholds are shares of the step (COM001-COM003) grades its cost with them; the others
    with the `[cost]` limits."""
    if attribution is None or attribution.measured_step_s <= 0:
        return
    default = cost_limits(config)
    for finding in findings:
        own = (rule_limits or {}).get(finding.rule, {})
        limits = own if {"high", "medium"} <= set(own) else default
        measure = COSTS.get(finding.rule)
        if measure is None or finding.pattern not in TIME_PATTERNS:
            continue
        cost_s = measure(finding, attribution)
        if cost_s is None:
            continue
        finding.cost_s = float(cost_s)
        finding.cost_share = float(cost_s) / attribution.measured_step_s
        finding.cost_range_s = _range(finding, measure, attribution)
        untraced_low = _if_untraced_waited(finding, attribution)
        if untraced_low is not None:
            low, high = finding.cost_range_s or (finding.cost_s, finding.cost_s)
            finding.cost_range_s = [min(low, untraced_low), high]
        highest = finding.cost_s if finding.cost_range_s is None else finding.cost_range_s[1]
        # the cost may lower a severity, never raise it above what the rule's own evidence
        # grades: a verdict that only noise on a loaded host makes costly stays as it was
        earned = severity_of(highest / attribution.measured_step_s, limits)
        finding.severity = max(finding.severity, earned, key=SEVERITY_ORDER.index)
        finding.evidence = {
            **finding.evidence,
            "counterfactual": _counterfactual(finding),
            **_explanation(finding, attribution),
        }
        if untraced_low is not None:
            where, reason = untraced_reason(attribution)
            finding.evidence["cost_range_where"] = where
            finding.evidence["cost_range_share"] = [
                c / attribution.measured_step_s for c in finding.cost_range_s or []
            ]
            finding.evidence["cost_range_reason"] = reason
        elif finding.cost_range_s is not None:
            where, reason = ambiguity_reason(attribution)
            finding.evidence["cost_range_where"] = where
            finding.evidence["cost_range_share"] = [
                c / attribution.measured_step_s for c in finding.cost_range_s
            ]
            finding.evidence["cost_range_reason"] = reason


RANGE_RESOLUTION_S = 5e-5
"""Costs in the two readings closer than this (s per step) are one cost, not a range."""


def _range(
    finding: Finding,
    measure: Callable[[Finding, Attribution], float | None],
    attribution: Attribution,
) -> list[float] | None:
    """The finding's cost in both readings of the ambiguous gaps, lower first; None where no
    gap is ambiguous or the two agree."""
    other = attribution.alternative
    if other is None or finding.cost_s is None:
        return None
    cost = measure(finding, other)
    if cost is None or abs(float(cost) - finding.cost_s) < RANGE_RESOLUTION_S:
        return None
    return sorted([finding.cost_s, float(cost)])


def _if_untraced_waited(finding: Finding, attribution: Attribution) -> float | None:
    """A communication finding's cost with the transfers that may be all waiting for
    untraced group members read as that waiting (diag/whatif/late_members.py): the low end
    of its range; None where no such transfer is, or the two agree."""
    if finding.cost_s is None or not finding.rule.startswith("COM"):
        return None
    if finding.rule == "COM001":
        low = attribution.transfers_if_untraced_waited_s
        low = None if low is None else _net_of_host(low, attribution)
    else:
        wanted = {"COM002": "tp", "COM003": "dp"}.get(finding.rule)
        found = [c.evidence.get("if_untraced_waited_s", c.cost_s) for c in attribution.causes
                 if c.kind == CauseKind.TRANSFER and c.group == wanted]  # fmt: skip
        unsure = any("if_untraced_waited_s" in c.evidence for c in attribution.causes
                     if c.kind == CauseKind.TRANSFER and c.group == wanted)  # fmt: skip
        low = float(sum(found)) if unsure else None
    if low is None or finding.cost_s - float(low) < RANGE_RESOLUTION_S:
        return None
    return float(low)


def untraced_reason(attribution: Attribution) -> tuple[str, str]:
    """Where and why a communication finding's cost is a range because some collectives'
    members left no records."""
    members = ranks_phrase(list(attribution.untraced_unsure_ranks))
    where = f"the collectives of groups with {members} (no records)"
    reason = (
        f"{members} left no records, and no faster collective of as many bytes bounds their "
        "groups' transfers: their time from the last traced arrival may be transfer (the high "
        f"end) or waiting for {members} (the low end); trace {members} to tell"
    )
    return where, reason


def ambiguity_reason(attribution: Attribution) -> tuple[str, str]:
    """Where the gaps whose reading decides the range are, in a few words (`the gaps before
    all_reduce (cp)`) and in a sentence with their time and ranks (the largest first, at most
    three places)."""
    table = attribution.ambiguous
    if table.empty:
        return "some time in no record", "some time in no record may be waiting"
    per_place = table.groupby("before", sort=True).agg(
        gap_s=("gap_s", "max"), ranks=("rank", lambda r: sorted(int(x) for x in r))
    )
    places = per_place.sort_values("gap_s", ascending=False).head(3)
    where = "the gaps before " + ", ".join(str(before) for before in places.index)
    said = [f"up to {row.gap_s * 1e3:.1f} ms per step before {before} on "
            f"{ranks_phrase(list(row.ranks))}" for before, row in places.iterrows()]  # fmt: skip
    reason = (
        f"the time in no record ({'; '.join(said)}) may be waiting for the last of the "
        "group to arrive: the ranks resumed there closer together than they arrived, though "
        "not together; the low end reads it as each rank's own time, the high end as waiting"
    )
    return where, reason


def _explanation(finding: Finding, attribution: Attribution) -> dict[str, Any]:
    """How the cost relates to what the user sees (a rank's excess against what of it reaches
    the step's end), and how much of the step's waiting the replay inferred from time in no
    record, where it did."""
    out: dict[str, Any] = {}
    kinds = STRAGGLER_CAUSES if finding.rule in ("BAL001", "BAL003") else (CauseKind.HOST,)
    if finding.rule in ("BAL001", "BAL003", "BAL005"):
        for cause in attribution.causes:
            if cause.kind in kinds and set(cause.ranks) & set(finding.ranks):
                if "explained" in cause.evidence:
                    out["cost_explained"] = cause.evidence["explained"]
                break
    gaps = attribution.gaps
    if not gaps.empty and float(gaps["waiting_s"].sum()) > 0:
        out["inferred_waiting_per_step_s"] = float(gaps["waiting_s"].mean())
    return out


def _counterfactual(finding: Finding) -> str:
    return {
        "BAL001": "the named ranks' typical excess over their peers removed",
        "BAL003": "the named ranks' typical excess over their peers removed",
        "BAL005": "the named ranks' host time at their peers' median",
        "BAL006": "the untraced members arriving with the last traced one",
        "BAL002": "every rank's local time at its peers' median in every step",
        "BAL004": "every step's per-rank imbalance removed, beyond each rank's typical excess",
        "COM001": "every collective's transfer at zero (waiting for late peers kept)",
        "COM002": "TP collectives' transfers at zero",
        "COM003": "DP collectives fully hidden (their transfers at zero)",
        "PIP002": "the theory bubble with 4x the micro-batches or 2 virtual stages",
        "PIP003": "the named stage's local time at the other stages' mean",
        "HST001": "every rank with its cores: each rank-step without its time waiting for one",
    }[finding.rule]


def cost_limits(config: Mapping[str, Any] | None) -> dict[str, float]:
    limits = {key: t.default for key, t in COST_LIMITS.items()}
    for name, value in ((config or {}).get(COST_TABLE) or {}).items():
        if name not in limits:
            raise ValueError(f"[{COST_TABLE}] has no threshold {name!r} (high, medium)")
        limits[name] = float(value)
    return limits


def severity_of(share: float, limits: Mapping[str, float]) -> str:
    if share >= limits["high"]:
        return "high"
    return "medium" if share >= limits["medium"] else "low"
