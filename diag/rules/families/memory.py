"""Memory rules (collapse pattern 5: OOM although the state estimate fits).

The six categories are measured apart (docs/physics.md, pattern 5) and compared with the device
budget (manifest `hardware.device_memory_bytes`, or the `oom_risk` events' budget): the dominant one
names the remedy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from diag.contract import schema
from diag.metrics import RunMetrics
from diag.numeric.keys import rank_steps_in
from diag.rules.engine import Finding, RuleContext, Threshold, rule

STATE = ("params", "grads", "optimizer")
"""What ZeRO shards (stage 1 optimizer, 2 + grads, 3 + params)."""
REMEDY = {
    "state": "shard the state with ZeRO / FSDP (stage 1: optimizer, 2: + gradients, "
    "3: + parameters)",
    "activations": "gradient accumulation with smaller micro-batches, activation "
    "recomputation (checkpointing), sequence / context parallel",
    "comm_buffers": "cap the communication buffers (smaller DDP bucket_cap_mb, FSDP2 "
    "reshard_after_forward, fewer all-gathers in flight)",
    "fragmentation": "allocator settings: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
    "fewer distinct tensor shapes",
}


@dataclass(frozen=True)
class Peak:
    rank: int
    step: int
    total_bytes: float  # peak_bytes: the six categories at the peak step, nulls as 0
    by_category: dict[str, float]
    dominant: str  # state | activations | comm_buffers | fragmentation
    dominant_bytes: float


def _group(category: str) -> str:
    return "state" if category in STATE else category


def _peaks(ctx: RuleContext) -> list[Peak]:
    """`peaks` of the run, found once for the rules that read them."""
    found: list[Peak] = ctx.derived_once("memory_peaks", lambda: peaks(ctx.metrics))
    return found


def peaks(metrics: RunMetrics) -> list[Peak]:
    """Per rank, its peak (`metrics.memory_peak`: the step whose six categories sum highest)
    with the breakdown of that step's record (`metrics.memory_steps`; of a step recorded twice,
    the record that holds the peak). Ranks whose peak is 0 are left out."""
    peak = metrics.memory_peak
    if peak.empty:
        return []
    cats = [c for c in schema.MEMORY_CATEGORIES if c in metrics.memory_steps]
    memory = metrics.memory_steps
    at_peak = rank_steps_in(memory["rank"], memory["step"], peak["rank"], peak["step"])
    records = memory.loc[at_peak, ["rank", "step", *cats]].merge(peak, on=["rank", "step"])
    held = records[cats].astype("float64").fillna(0.0).sum(axis=1)
    records = records.loc[held.groupby([records["rank"], records["step"]]).idxmax()]
    out = []
    for row in records.sort_values("rank").to_dict("records"):
        by_category = {c: float(row[c]) for c in cats if pd.notna(row[c])}
        groups: dict[str, float] = {}
        for name, value in by_category.items():
            groups[_group(name)] = groups.get(_group(name), 0.0) + value
        if not groups or row["peak_bytes"] <= 0:
            continue
        dominant = max(groups, key=lambda g: groups[g])
        out.append(
            Peak(
                int(row["rank"]),
                int(row["step"]),
                float(row["peak_bytes"]),
                by_category,
                dominant,
                groups[dominant],
            )
        )
    return out


def budget_bytes(ctx: RuleContext) -> float | None:
    """The device budget: the manifest's, else the one the `oom_risk` events recorded."""
    declared = ctx.run.manifest.hardware.device_memory_bytes
    if declared:
        return float(declared)
    events = ctx.run.events
    risks = events[events["name"] == "oom_risk"] if not events.empty else events
    values = [f.get("budget_bytes") for f in risks.get("fields", [])]
    numbers = [float(v) for v in values if isinstance(v, int | float) and v > 0]
    return min(numbers) if numbers else None


def _evidence(peak: Peak, budget: float) -> dict[str, Any]:
    return {
        "budget_bytes": budget,
        "total_bytes": peak.total_bytes,
        "share_of_budget": peak.total_bytes / budget,
        "dominant": peak.dominant,
        "dominant_bytes": peak.dominant_bytes,
        "state_bytes": sum(peak.by_category.get(c, 0.0) for c in STATE),
        "categories": peak.by_category,
        "rank": peak.rank,
        "step": peak.step,
    }


@rule(
    "MEM001",
    "memory.over_budget",
    pattern=5,
    thresholds={
        "medium": Threshold(0.90, "fraction", "six-category total / device budget: medium"),
        "high": Threshold(1.00, "fraction", "six-category total / device budget: high"),
    },
)
def over_budget(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The measured memory exceeds (or nearly exceeds) the device.

    Symptom:
        The sum of the six categories (parameters, gradients, optimizer state, activations,
        communication buffers, fragmentation) at a rank's peak step reaches the device budget.
    Likely cause:
        Whatever dominates: activations (long sequences, large micro-batches, ZeRO does not touch
        them), communication buffers (buckets, FSDP all-gathers), fragmentation, or unsharded
        state.
    Fix:
        By the dominant category: activations -> accumulation, recomputation, SP/CP;
        communication buffers -> cap them; fragmentation -> allocator settings; state -> a
        higher ZeRO stage.
    Evidence:
        Per rank at its peak step: total, budget, share, the dominant group and every category.
    """
    budget = budget_bytes(ctx)
    if not budget:
        return []
    over = [p for p in _peaks(ctx) if p.total_bytes >= limits["medium"] * budget]
    if not over:
        return []
    worst = max(over, key=lambda p: p.total_bytes)
    share = worst.total_bytes / budget
    severity = "high" if share >= limits["high"] else "medium"
    return [
        Finding(
            severity=severity,
            title=f"memory at {share:.0%} of the device budget; {worst.dominant} dominate "
            f"({worst.dominant_bytes / worst.total_bytes:.0%})",
            ranks=sorted(p.rank for p in over),
            evidence={**_evidence(worst, budget), "threshold": limits[severity]},
            advice=REMEDY[worst.dominant],
            margin=share / limits["high"],
        )
    ]


@rule("MEM002", "memory.oom", pattern=5)
def oom_event(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The run hit an out-of-memory error.

    Symptom:
        An `oom` event: the device allocator failed; the event holds the six categories at that
        moment.
    Likely cause:
        The dominant category at the OOM: activations, communication buffers, fragmentation or
        state.
    Fix:
        By the dominant category (see MEM001): accumulation / recompute / SP / CP; cap comm
        buffers; allocator settings; a higher ZeRO stage.
    Evidence:
        The ranks with an `oom` event, its message, and the dominant category of the first one.
    """
    events = ctx.run.events
    if events.empty:
        return []
    ooms = events[events["name"] == "oom"]
    if ooms.empty:
        return []
    first = ooms.iloc[0]
    fields = dict(first["fields"] or {})
    breakdown = {c: float(fields[c]) for c in schema.MEMORY_CATEGORIES if fields.get(c)}
    groups: dict[str, float] = {}
    for name, value in breakdown.items():
        groups[_group(name)] = groups.get(_group(name), 0.0) + value
    dominant = max(groups, key=lambda g: groups[g]) if groups else None
    return [
        Finding(
            severity="high",
            title="out of memory" + (f"; {dominant} dominate" if dominant else ""),
            ranks=sorted({int(r) for r in ooms["rank"]}),
            evidence={
                "message": fields.get("message"),
                "step": int(first["step"]),
                "dominant": dominant,
                "categories": breakdown,
            },
            advice=REMEDY[dominant]
            if dominant
            else "measure the six categories to find what dominates",
        )
    ]


@rule(
    "MEM003",
    "memory.state_or_activations",
    pattern=5,
    thresholds={
        "near": Threshold(0.70, "fraction", "six-category total / budget to ask the question"),
    },
)
def state_or_activations(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The third question: is memory pressure from state or from activations?

    Symptom:
        Memory is near the device budget; the answer decides the remedy.
    Likely cause:
        State (parameters + gradients + optimizer) above activations: the model is state-bound.
        Activations above state: activation-bound (sequence length, micro-batch), where ZeRO
        does not help.
    Fix:
        State-bound -> ZeRO-2/3 / FSDP. Activation-bound -> accumulation, recomputation, SP/CP.
    Evidence:
        state_bytes and activations_bytes at the peak step of the fullest rank, share of budget.
    """
    budget = budget_bytes(ctx)
    if not budget:
        return []
    near = [p for p in _peaks(ctx) if p.total_bytes >= limits["near"] * budget]
    if not near:
        return []
    worst = max(near, key=lambda p: p.total_bytes)
    state = sum(worst.by_category.get(c, 0.0) for c in STATE)
    activations = worst.by_category.get("activations", 0.0)
    bound = "state" if state >= activations else "activations"
    return [
        Finding(
            severity="low",
            title=f"memory near the budget is {bound}-bound (state {state / 2**20:.1f} MiB, "
            f"activations {activations / 2**20:.1f} MiB)",
            ranks=[worst.rank],
            evidence={
                "bound": bound,
                "state_bytes": state,
                "activations_bytes": activations,
                "share_of_budget": worst.total_bytes / budget,
            },
            advice=REMEDY[bound],
        )
    ]
