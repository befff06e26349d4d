"""Configuration pitfalls (no collapse pattern): the frequent failures of docs/physics.md that a
run's records show: a forgotten `set_epoch`, clipping on local norms, a loss gone NaN."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics.epochs import DERIVED_NAME, epoch_orders, last_orders
from diag.rules.engine import Finding, RuleContext, Threshold, rule


def _events(ctx: RuleContext, name: str) -> pd.DataFrame:
    events = ctx.run.events
    return events[events["name"] == name] if not events.empty else events


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@rule(
    "PIT001",
    "pitfalls.set_epoch",
    pattern=None,
    thresholds={"min_epochs": Threshold(2, "epochs", "epochs a rank must see to compare orders")},
)
def forgotten_set_epoch(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Every epoch reads the samples in the same order: `sampler.set_epoch` is never called.

    Symptom:
        A DP rank's `epoch` events carry the same `order_hash` in every epoch.
    Likely cause:
        `DistributedSampler.set_epoch(epoch)` is not called before each epoch, so the shuffle
        seed never changes and each rank sees an identical order every epoch.
    Fix:
        Call `sampler.set_epoch(epoch)` at the start of every epoch.
    Evidence:
        Per rank, the epochs seen and the number of distinct order hashes among them.
    """
    seen = ctx.derived_once(DERIVED_NAME, lambda: last_orders(epoch_orders(ctx.run.events)))
    by_rank = seen.groupby("rank", sort=True)["digest"]
    table = pd.DataFrame({"epochs": by_rank.size(), "orders": by_rank.nunique()})
    table = table[(table["epochs"] >= limits["min_epochs"]) & (table["orders"] == 1)]
    repeated = {int(rank): int(count) for rank, count in table["epochs"].items()}
    if not repeated:
        return []
    epochs = max(repeated.values())
    return [
        Finding(
            severity="medium",
            title=f"same sample order in all {epochs} epochs: sampler.set_epoch is not called",
            ranks=sorted(repeated),
            evidence={
                "epochs_per_rank": dict(sorted(repeated.items())),
                "distinct_orders": 1,
            },
            advice="call sampler.set_epoch(epoch) at the start of every epoch",
        )
    ]


@rule(
    "PIT002",
    "pitfalls.local_norm_clipping",
    pattern=None,
    thresholds={
        "tolerance": Threshold(0.01, "fraction", "relative gap of local below global norm"),
    },
)
def local_norm_clipping(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Gradient norms differ per rank: clipping on a local norm under-clips.

    Symptom:
        `grad_norm` events whose `local` norm (the gradients this rank holds: its shards under
        ZeRO/SP/TP) is below the `global` one, or that record only a local norm on a run
        whose ranks hold shards.
    Likely cause:
        `clip_grad_norm_` applied to the local shard's gradients: each rank sees a smaller norm
        than the true one and clips too little (or differently per rank).
    Fix:
        Clip on the global norm: all-reduce the squared local norms (FSDP2/DTensor
        `clip_grad_norm_` does), then scale every shard by the same factor.
    Evidence:
        The smallest local/global ratio, the ranks where local differs, whether a global norm
        is recorded at all.
    """
    events = _events(ctx, "grad_norm")
    gaps: dict[int, float] = {}
    local_only: set[int] = set()
    for rank, fields in zip(events.get("rank", []), events.get("fields", []), strict=True):
        local, total = _number((fields or {}).get("local")), _number((fields or {}).get("global"))
        if local is None:
            continue
        if total is None:
            local_only.add(int(rank))
        elif total > 0 and (total - local) / total > limits["tolerance"]:
            gaps[int(rank)] = min(gaps.get(int(rank), 1.0), local / total)
    layout = ctx.run.manifest.layout
    sharded = (layout.zero_stage or 0) >= 2 or (layout.tp or 1) > 1 or (layout.cp or 1) > 1
    if gaps:
        ratio = min(gaps.values())
        return [
            Finding(
                severity="low",
                title=f"local gradient norms are down to {ratio:.0%} of the global norm: "
                "clipping must use the global one",
                ranks=sorted(gaps),
                evidence={"min_local_over_global": ratio, "global_recorded": True},
                advice="clip on the global (all-reduced) norm, e.g. FSDP2/DTensor "
                "clip_grad_norm_; never clip each shard by its local norm",
            )
        ]
    if local_only and sharded:
        return [
            Finding(
                severity="medium",
                title="gradients are clipped on local norms of sharded gradients (no global "
                "norm recorded)",
                ranks=sorted(local_only),
                evidence={
                    "global_recorded": False,
                    "zero_stage": layout.zero_stage,
                    "tp": layout.tp,
                    "cp": layout.cp,
                },
                advice="all-reduce the squared local norms and clip every shard by the global norm",
            )
        ]
    return []


@rule(
    "PIT003",
    "pitfalls.nonfinite_loss",
    pattern=None,
    thresholds={"min_steps": Threshold(1, "steps", "step records with a NaN or inf loss")},
)
def nonfinite_loss(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The loss became NaN or infinite.

    Symptom:
        Step records whose `loss` is NaN or inf after finite ones on the same rank (a run that
        records no loss at all is not judged).
    Likely cause:
        A learning rate too high, fp16/fp8 overflow from bad loss or scaling factors, a division
        by zero in the loss, corrupted data.
    Fix:
        Lower the learning rate or add warm-up, use bf16 or dynamic loss scaling, clip
        gradients on the global norm, check the data of the first bad step.
    Evidence:
        The number of such steps, the first one, and the ranks.
    """
    steps = ctx.run.steps
    if steps.empty:
        return []
    finite = np.isfinite(steps["loss"].astype(float))
    first_finite = steps.loc[finite, ["rank", "step"]].groupby("rank")["step"].min()
    after = steps["step"] > steps["rank"].map(first_finite)  # NaN (no finite loss) -> False
    bad = steps[after & ~finite]  # a loss that was finite, then NaN/inf (not a missing one)
    if len(bad) < limits["min_steps"]:
        return []
    return [
        Finding(
            severity="high",
            title=f"loss is NaN or inf from step {int(bad['step'].min())}",
            ranks=sorted({int(r) for r in bad["rank"]}),
            evidence={"steps": int(bad["step"].nunique()), "first_step": int(bad["step"].min())},
            advice="lower the learning rate or warm it up, use bf16 or dynamic loss scaling, "
            "clip on the global norm",
        )
    ]


def _grad_sync_declarations(ctx: RuleContext) -> dict[int, dict[str, Any]]:
    """rank -> the `grad_sync` event of its DDP/FSDP2 wrapper over 2+ ranks (the last one)."""
    events = _events(ctx, "grad_sync")
    found: dict[int, dict[str, Any]] = {}
    for rank, fields in zip(events.get("rank", []), events.get("fields", []), strict=True):
        size = _number((fields or {}).get("group_size"))
        if size is not None and size > 1 and isinstance((fields or {}).get("tag"), str):
            found[int(rank)] = fields
    return found


def _checksum_drift(ctx: RuleContext, tolerance: float) -> tuple[int, float] | None:
    """(first step, relative spread) where the ranks' `param_checksum` values differ."""
    events = _events(ctx, "param_checksum").sort_values("step", kind="stable")
    for step, fields in zip(events.get("step", []), events.get("fields", []), strict=True):
        raw = (fields or {}).get("values")
        values = [v for v in map(_number, raw if isinstance(raw, list) else []) if v is not None]
        if len(values) < 2:
            continue
        scale = max(max(abs(v) for v in values), 1e-12)
        spread = (max(values) - min(values)) / scale
        if spread > tolerance:
            return int(step), spread
    return None


@rule(
    "PIT004",
    "pitfalls.no_grad_sync",
    pattern=None,
    thresholds={
        "checksum_tolerance": Threshold(
            1e-6, "fraction", "spread of the ranks' parameter checksums over the largest"
        ),
    },
)
def gradients_not_synchronised(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Ranks train a DDP/FSDP model, but its gradients are never synchronised.

    Symptom:
        A rank registered a DDP or FSDP2 model over 2+ ranks (`grad_sync` event) and the run
        records no collective with its gradient tag at all; or the ranks' opt-in parameter
        checksums (`param_checksum` events, `checksum_every=`) differ at a step.
    Likely cause:
        The forward runs through the unwrapped module (`model(x)` where the DDP wrapper was
        meant), so DDP's backward hooks never fire; `no_sync()` left on; gradients reduced
        by hand over the wrong group. Each rank then trains its own model, silently.
    Fix:
        Run forward and backward through the wrapper (`ddp_model(x)`), leave `no_sync()`
        only around accumulation micro-steps, reduce over the DP group.
    Evidence:
        The wrapper, its group size and tag, the gradient collectives recorded (0), the steps;
        or the first step whose checksums differ and their relative spread.
    """
    declared = _grad_sync_declarations(ctx)
    if not declared or ctx.run.steps.empty:
        return []
    first = next(iter(declared.values()))
    evidence: dict[str, Any] = {
        "wrapper": first.get("wrapper"),
        "group_size": first.get("group_size"),
        "tag": first.get("tag"),
    }
    totals = ctx.metrics.comm_totals
    tags = {str(fields.get("tag")) for fields in declared.values()}
    synced = totals[totals["tag"].isin(tags)] if not totals.empty else totals
    silent = sorted(set(declared) - {int(r) for r in synced.get("rank", [])})
    drift = _checksum_drift(ctx, limits["checksum_tolerance"])
    if not silent and drift is None:
        return []
    if silent:
        evidence |= {"grad_collectives": 0, "steps": int(ctx.run.steps["step"].nunique())}
        title = (
            f"{evidence['wrapper'] or 'DP'} model on {evidence['group_size']} ranks, but no "
            "gradient collective was recorded: the ranks train apart"
        )
    if drift is not None:
        evidence |= {"checksum_step": drift[0], "checksum_spread": drift[1]}
        if not silent:
            title = f"the ranks' parameters differ at step {drift[0]}: gradients are not synced"
    return [
        Finding(
            severity="high",
            title=title,
            ranks=silent or sorted(declared),
            evidence=evidence,
            advice="run forward and backward through the DDP/FSDP wrapper (ddp_model(x), not "
            "the inner module); keep no_sync() to accumulation micro-steps",
        )
    ]
