"""Pipeline rules (collapse pattern 3: speedup far below theory): bubble and stage balance."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from diag.contract import ledger
from diag.metrics import pipeline as pipe
from diag.read.roles import rank_stages
from diag.rules.engine import Finding, RuleContext, Threshold, rule
from diag.whatif.causes import CauseKind


def _stage_bubbles(ctx: RuleContext) -> dict[int, float]:
    stages = pipe.stage_table(ctx.metrics.ranks)
    return {int(s): float(b) for s, b in zip(stages["stage"], stages["bubble_frac"], strict=True)}


@rule(
    "PIP001",
    "pipeline.bubble_above_theory",
    pattern=3,
    thresholds={
        "excess": Threshold(0.20, "fraction", "measured bubble minus the theory's: at least"),
    },
)
def bubble_above_theory(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The pipeline idles far more than its schedule allows.

    Symptom:
        The measured bubble (share of a stage's step without compute) is well above
        (p-1)/(v·m+p-1), the bubble the schedule implies for p stages and m micro-batches.
    Likely cause:
        Stage imbalance (the slowest stage paces all), a stage boundary on a slow link
        (send/recv latency), exposed DP communication in PP x DP, a straggler stage.
    Fix:
        Balance layers across stages, keep each boundary's link fast or overlap send/recv,
        overlap the DP all-reduce with the cooldown; then raise m.
    Evidence:
        summary.bubble_fraction against summary.bubble_theory, with each stage's bubble.
    """
    summary = ctx.metrics.summary
    measured, theory = summary.get("bubble_fraction"), summary.get("bubble_theory")
    if measured is None or theory is None or measured - theory < limits["excess"]:
        return []
    return [
        Finding(
            severity="medium",
            title=f"pipeline bubble {measured:.0%} against {theory:.0%} in theory",
            evidence={
                "bubble_fraction": measured,
                "bubble_theory": theory,
                "stage_bubble": _stage_bubbles(ctx),
                "stage_imbalance": summary.get("stage_imbalance"),
                "excess_threshold": limits["excess"],
            },
            advice="balance the stages and keep stage boundaries on fast links before adding "
            "micro-batches; overlap the DP all-reduce of PP x DP",
        )
    ]


@rule(
    "PIP002",
    "pipeline.few_microbatches",
    pattern=3,
    thresholds={
        "per_stage": Threshold(4, "micro-batches", "rule of thumb: m >= this x p"),
        "high_bubble": Threshold(0.40, "fraction", "theory bubble at which the finding is high"),
    },
)
def few_microbatches(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Too few micro-batches for the number of pipeline stages.

    Symptom:
        m < 4p: the fill and drain of the pipeline take a large share of every step, e.g.
        p=8, m=4 idles 7/11 = 64% of the step, p=4, m=2 60%.
    Likely cause:
        The global batch split into too few micro-batches (micro-batch too large), or more
        stages than the model depth needs.
    Fix:
        More micro-batches (m >= 4p: a smaller micro-batch or gradient accumulation), interleaved
        1F1B with v=2 virtual stages (divides the bubble by v), or fewer stages.
    Evidence:
        p, m and v from the layout with the ledger's bubble (p-1)/(v·m+p-1), the measured
        bubble, and the bubble at m = 4p.
    """
    layout = ctx.run.manifest.layout
    p, m, v = layout.pp or 1, layout.microbatches or 1, layout.virtual_stages or 1
    wanted = int(limits["per_stage"] * p)
    if p <= 1 or m >= wanted or not ctx.run.manifest.schedule_known:
        return []
    theory = ledger.bubble_fraction(p, m, v)
    severity = "high" if theory >= limits["high_bubble"] else "medium"
    return [
        Finding(
            severity=severity,
            title=f"m={m} micro-batches for p={p} stages (< {wanted}): {theory:.0%} bubble in "
            "theory",
            evidence={
                "pp": p,
                "microbatches": m,
                "virtual_stages": v,
                "bubble_theory": theory,
                "bubble_fraction": ctx.metrics.summary.get("bubble_fraction"),
                "bubble_theory_at_4p": ledger.bubble_fraction(p, wanted, v),
                "bubble_theory_interleaved_v2": ledger.bubble_fraction(p, m, 2 * v),
            },
            advice=f"raise micro-batches to >= {wanted} (smaller micro-batch or accumulation) "
            "or use interleaved 1F1B with v=2; fewer stages if the model allows",
        )
    ]


def _holding(ctx: RuleContext, stage: int) -> set[int]:
    """The ranks the layout puts on a stage, traced or not (a trace folder often holds one
    rank per tensor-parallel group: the stage is still all of its ranks)."""
    if not ctx.run.manifest.groups.get("pp"):
        return set()
    stages = rank_stages(ctx.run.spans, ctx.run.manifest)
    return {rank for rank, at in stages.items() if at == stage}


@rule(
    "PIP003",
    "pipeline.stage_imbalance",
    pattern=3,
    thresholds={
        "min_cost_share": Threshold(
            0.05, "fraction", "share of the step the replay says the heaviest stage costs: at least"
        ),
        "imbalance": Threshold(
            1.3, "ratio", "without a replay: max over mean compute per step across stages"
        ),
    },
)
def stage_imbalance(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """One pipeline stage takes much longer than the others and paces the pipeline.

    Symptom:
        Levelling the heaviest stage's local time (compute and its host work) to the other
        stages' mean shortens the replayed step by a share of it (any number of stages:
        with two, max/mean compute can barely reach 1.3 however slow one stage is); without a
        replay, its compute per step is well above the mean over stages.
    Likely cause:
        An uneven split of layers over stages, or extra work on one stage (embedding, LM head
        and loss on the first/last stage), a slower device holding one stage.
    Fix:
        Move layers off the heaviest stage (fewer blocks on the stage with the LM head), split
        the embedding/head, or give stages uneven layer counts that even out compute.
    Evidence:
        The replay's stage cause (its cost, the stage's local time per step against the other
        stages' mean), summary.stage_imbalance and each stage's compute per step; the finding
        names the ranks of the heaviest stage.
    """
    imbalance = ctx.metrics.summary.get("stage_imbalance")
    stages = pipe.stage_table(ctx.metrics.ranks)
    attribution = ctx.metrics.attribution
    costly = attribution.cause(CauseKind.STAGE) if attribution is not None else None  # by cost
    if costly is not None and attribution is not None and attribution.measured_step_s > 0:
        share = costly.cost_s / attribution.measured_step_s
        if share < limits["min_cost_share"] or costly.stage is None:
            return []
        heaviest = int(costly.stage)
        blamed = sorted(set(costly.ranks) | _holding(ctx, heaviest))
        local = float(costly.evidence.get("stage_local_s", 0.0))
        others = float(costly.evidence.get("mean_stage_local_s", 0.0))
        ratio = local / others if others > 0 else float("inf")
        title = (f"stage {heaviest} takes {ratio:.2f}x the other stages' time per step "
                 f"({local * 1e3:.0f} ms against {others * 1e3:.0f} ms)")  # fmt: skip
        evidence: dict[str, object] = {
            "stage_local_per_step_s": local,
            "other_stages_mean_per_step_s": others,
            "replay_cost_share": share,
            "min_cost_share": limits["min_cost_share"],
        }
    else:
        if imbalance is None or imbalance < limits["imbalance"] or stages.empty:
            return []
        heaviest = int(stages.loc[stages["busy_per_step_s"].idxmax(), "stage"])
        ranks = ctx.metrics.ranks
        blamed = sorted(int(r) for r in ranks.loc[ranks["stage"] == heaviest, "rank"])
        title = f"stage {heaviest} computes {imbalance:.2f}x the mean stage"
        evidence = {"threshold": limits["imbalance"]}
    busy = {} if stages.empty else {
        int(s): float(b) for s, b in zip(stages["stage"], stages["busy_per_step_s"], strict=True)
    }  # fmt: skip
    return [
        Finding(
            severity="medium",
            title=title,
            ranks=blamed,
            evidence={
                **evidence,
                "stage_imbalance": imbalance,
                "busy_per_step_s": busy,
                "heaviest_stage": heaviest,
            },
            advice=f"move layers off stage {heaviest} or split its extra work (embedding, LM "
            "head, loss) so stages take about the same time",
        )
    ]
