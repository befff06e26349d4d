"""MoE rules (collapse pattern 4: MoE quality does not improve or suddenly drops).

Read the expert-load distribution and the drop rate directly, and the all-to-all bytes against
`tokens x topk x hidden x dtype` (docs/physics.md, "EP").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from diag.contract import schema
from diag.metrics.experts import layer_label
from diag.rules.engine import Finding, RuleContext, Threshold, grade, rule

EP_ALLTOALL_TAGS = ("dispatch", "combine", "dispatch.bwd", "combine.bwd")
"""The token all-to-alls of the ep trainer (the `splits` count exchange is left out)."""


def _worst(experts: pd.DataFrame, column: str) -> pd.Series | None:
    """The MoE layer row with the largest `column`, None without one."""
    rows = experts.dropna(subset=[column])
    if rows.empty:
        return None
    return rows.loc[rows[column].astype(float).idxmax()]


@rule(
    "MOE001",
    "moe.drop_rate",
    pattern=4,
    thresholds={
        "medium": Threshold(0.05, "fraction", "dropped token assignments / routed: medium"),
        "high": Threshold(0.20, "fraction", "dropped token assignments / routed: high"),
    },
)
def drop_rate(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Experts drop many of the tokens routed to them.

    Symptom:
        A large share of the (token, expert) assignments overflows the experts' capacity and is
        dropped: those tokens skip the expert layer.
    Likely cause:
        Capacity factor too small for the actual load, or a router that sends most tokens to a
        few experts (see MOE002).
    Fix:
        Raise the capacity factor (e.g. 1.25-2.0), balance the router (aux-loss coefficient
        ~0.01), or use a dropless MoE.
    Evidence:
        experts.drop_rate of the worst layer, its first and last step, the capacity factor.
    """
    row = _worst(ctx.metrics.experts, "drop_rate")
    rate = None if row is None else float(row["drop_rate"])
    severity = grade(rate, limits)
    if row is None or rate is None or severity is None:
        return []
    return [
        Finding(
            severity=severity,
            title=f"MoE layer {layer_label(row['layer'])} drops {rate:.0%} of routed tokens",
            evidence={
                "layer": layer_label(row["layer"]),
                "drop_rate": rate,
                "drop_rate_first": row["drop_rate_first"],
                "drop_rate_last": row["drop_rate_last"],
                "capacity_factor": ctx.run.manifest.model.capacity_factor,
                "threshold": limits[severity],
            },
            advice="raise the capacity factor or balance the router (aux-loss coefficient "
            "~0.01); a dropless MoE removes drops altogether",
            margin=rate / limits["high"],
        )
    ]


@rule(
    "MOE002",
    "moe.load_imbalance",
    pattern=4,
    thresholds={
        "medium": Threshold(1.50, "ratio", "busiest expert's tokens / mean: medium"),
        "high": Threshold(2.50, "ratio", "busiest expert's tokens / mean: high"),
    },
)
def load_imbalance(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Tokens pile onto a few experts.

    Symptom:
        The busiest expert of a layer gets far more tokens than the mean (max over mean, with
        the coefficient of variation beside it).
    Likely cause:
        Router collapse: an aux-loss coefficient too small (or 0), hot experts reinforced by
        training, a skewed data mix.
    Fix:
        Aux-loss coefficient ~0.01, router z-loss, expert-choice or capacity-aware routing;
        check the coefficient (MOE005).
    Evidence:
        experts.max_over_mean and load_cv of the worst layer, first and last step values.
    """
    row = _worst(ctx.metrics.experts, "max_over_mean")
    ratio = None if row is None else float(row["max_over_mean"])
    severity = grade(ratio, limits)
    if row is None or ratio is None or severity is None:
        return []
    return [
        Finding(
            severity=severity,
            title=f"MoE layer {layer_label(row['layer'])}: busiest expert gets {ratio:.2f}x the "
            "mean load",
            evidence={
                "layer": layer_label(row["layer"]),
                "max_over_mean": ratio,
                "load_cv": row["load_cv"],
                "max_over_mean_first": row["max_over_mean_first"],
                "max_over_mean_last": row["max_over_mean_last"],
                "tokens_per_expert": row["tokens_per_expert"],
                "threshold": limits[severity],
            },
            advice="balance the router: aux-loss coefficient ~0.01, router z-loss, or "
            "capacity-aware routing",
            margin=ratio / limits["high"],
        )
    ]


@rule(
    "MOE003",
    "moe.dead_experts",
    pattern=4,
    thresholds={
        "min_dead": Threshold(1, "experts", "experts of a layer that got no token in the run"),
        "high_fraction": Threshold(0.25, "fraction", "share of a layer's experts dead: high"),
    },
)
def dead_experts(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Some experts receive no token at all.

    Symptom:
        Experts of a layer have zero tokens over every analysed step: their parameters never
        train, and the model's capacity is smaller than it looks.
    Likely cause:
        Router collapse onto a few experts (aux loss too weak), a bad router initialisation, or
        an EP x TP shard mismatch that sends no token to some experts.
    Fix:
        Aux-loss coefficient ~0.01, re-initialise the router, check the expert-to-rank mapping.
    Evidence:
        experts.dead_experts of the worst layer and its experts count.
    """
    row = _worst(ctx.metrics.experts, "dead_experts")
    if row is None or row["dead_experts"] < limits["min_dead"]:
        return []
    dead, width = int(row["dead_experts"]), int(row["experts"])
    severity = "high" if dead >= limits["high_fraction"] * width else "medium"
    return [
        Finding(
            severity=severity,
            title=f"MoE layer {layer_label(row['layer'])}: {dead} of {width} experts got no token",
            evidence={"layer": layer_label(row["layer"]), "dead_experts": dead, "experts": width},
            advice="strengthen load balancing (aux-loss coefficient ~0.01) or re-initialise "
            "the router; check the expert-to-rank mapping",
        )
    ]


@rule(
    "MOE004",
    "moe.alltoall_bytes",
    pattern=4,
    thresholds={
        "tolerance": Threshold(0.20, "fraction", "all-to-all bytes off the theory (drops removed)"),
        "high": Threshold(1.00, "fraction", "all-to-all bytes off the theory: high"),
    },
)
def alltoall_bytes(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The EP all-to-all moves far more (or fewer) bytes than the tokens need.

    Symptom:
        Measured dispatch/combine bytes differ from `tokens x topk x hidden x dtype` by more
        than the dropped share explains.
    Likely cause:
        Above: capacity padding too large or token duplication. Below: tokens lost in the
        all-to-all, or an EP x TP shard mismatch.
    Fix:
        Lower the capacity factor or send unpadded splits; check the dispatch for duplicated or
        lost tokens and the EP/TP layout.
    Evidence:
        Per all-to-all tag: bytes, expected bytes, ratio, and the ratio expected from the drop
        rate (1 - drop rate).
    """
    table = ctx.metrics.collectives
    rows = table[
        (table["op"] == schema.CollectiveOp.ALL_TO_ALL.value)
        & table["tag"].isin(EP_ALLTOALL_TAGS)
        & table["ratio"].notna()
    ]
    if rows.empty:
        return []
    experts = ctx.metrics.experts
    drops = experts["drop_rate"].dropna() if not experts.empty else pd.Series(dtype=float)
    kept = 1.0 - float(drops.mean()) if len(drops) else 1.0
    if kept <= 0:
        return []
    off = (rows["ratio"].astype(float) / kept - 1.0).abs()
    if off.max() <= limits["tolerance"]:
        return []
    worst = rows.loc[off.idxmax()]
    deviation = float(off.max())
    severity = "high" if deviation >= limits["high"] else "medium"
    direction = "more" if worst["ratio"] > kept else "fewer"
    return [
        Finding(
            severity=severity,
            title=f"all-to-all {worst['tag']} moves {worst['ratio']:.2f}x the theory's bytes "
            f"({direction} than tokens x topk x hidden x dtype)",
            evidence={
                "tag": worst["tag"],
                "bytes": worst["bytes"],
                "expected_bytes": worst["expected_bytes"],
                "ratio": worst["ratio"],
                "ratio_expected_from_drops": kept,
                "threshold": limits["tolerance"],
            },
            advice="padding or duplicated tokens if more (lower the capacity factor, send "
            "unpadded splits); lost tokens or an EP x TP mismatch if fewer",
        )
    ]


@rule(
    "MOE005",
    "moe.aux_loss_coef",
    pattern=4,
    thresholds={
        "min": Threshold(0.001, "coefficient", "aux-loss coefficient below this: collapse risk"),
        "max": Threshold(0.1, "coefficient", "aux-loss coefficient above this: hurts quality"),
    },
)
def aux_loss_coef(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The load-balancing aux-loss coefficient is outside the sane range (~0.01).

    Symptom:
        The manifest's model.aux_loss_coef of an MoE model is 0 or tiny, or far above 0.01.
    Likely cause:
        Too small: nothing stops the router from collapsing onto a few experts. Too large: the
        balancing term outweighs the language-model loss and hurts quality.
    Fix:
        Use a coefficient around 0.01 (Switch Transformer, GShard range 0.001-0.1).
    Evidence:
        model.aux_loss_coef against the min and max thresholds; the model's experts count.
    """
    model = ctx.run.manifest.model
    coef = model.aux_loss_coef
    if coef is None or not (model.experts or not ctx.metrics.experts.empty):
        return []
    if limits["min"] <= coef <= limits["max"]:
        return []
    low = coef < limits["min"]
    return [
        Finding(
            severity="medium",
            title=f"aux-loss coefficient {coef:g} is {'too small' if low else 'too large'} "
            "(sane ~0.01)",
            evidence={"aux_loss_coef": coef, "min": limits["min"], "max": limits["max"]},
            advice="set the aux-loss coefficient near 0.01: "
            + ("a weak one lets the router collapse" if low else "a strong one hurts quality"),
        )
    ]
