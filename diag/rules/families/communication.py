"""Communication rules (collapse pattern 1: more GPUs, slower)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pandas as pd

from diag.metrics import NS_PER_S, in_steps, whole_steps
from diag.metrics.host import waiting_share
from diag.numeric import intervals
from diag.outputs.units import ranks_phrase
from diag.rules.engine import Finding, RuleContext, Threshold, grade, rule
from diag.rules.families.balance import straggler_ranks
from diag.whatif.late_members import untraced_in_groups


@rule(
    "COM001",
    "communication.exposed_share",
    pattern=1,
    thresholds={
        "high": Threshold(0.40, "fraction", "exposed communication share of the step: high"),
        "medium": Threshold(0.20, "fraction", "exposed communication share of the step: medium"),
    },
)
def exposed_comm_share(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The step waits on communication that nothing hides.

    Symptom:
        A large share of every step is communication no computation overlaps (exposed), so
        adding ranks adds waiting, not throughput.
    Likely cause:
        Collectives too large or too slow for the links (TP over a slow link, small GEMMs per
        rank against constant collective sizes), too little work per rank to hide DP all-reduces
        behind backward, or buckets too coarse to overlap.
    Fix:
        Give each rank more work (larger micro-batch, fewer ranks on this dimension), keep TP/EP
        inside a node, tune DDP buckets so all-reduces start earlier, overlap communication.
    Evidence:
        summary.exposed_comm_share, less the share the ranks waited for a core where it was
        recorded (the host's, HST001), and comm_share against the thresholds. When a straggler
        (BAL001) explains the waiting, the finding stays medium and names it; so it does in a
        pipeline run, whose blocking receives are the bubble (PIP rules), and where ranks of
        the analysed ranks' groups left no records (`unrecorded_peers`): some of the waiting
        may be theirs (BAL006 where the sizes bound it); and where the layout is unknown
        (`arrival_unknown`: who a collective's members are, so who waited for whom, unknown).
    """
    summary = ctx.metrics.summary
    exposed = summary.get("exposed_comm_share")
    host_share = waiting_for_a_core_share(ctx)
    if exposed is not None and host_share:
        # a collective's thread waiting for a core is the host's time (HST001), not the link's
        exposed = max(float(exposed) - host_share, 0.0)
    severity = grade(exposed, limits)
    if exposed is None or severity is None:
        return []
    stragglers = straggler_ranks(ctx)
    pipelined = (ctx.run.manifest.layout.pp or 1) > 1
    unrecorded = unrecorded_peers(ctx)
    # a layout the traces do not give: who each collective's members are, so how long a rank
    # waited in it for a late one (the arrival split, the replay), is unknown
    members_unknown = ctx.run.manifest.layout_unknown and int(ctx.run.manifest.world_size) > 1
    if stragglers or pipelined or unrecorded or members_unknown:
        # the waiting is a straggler's (BAL001), the pipeline bubble's (PIP rules), or may be
        # for peers that left no records (BAL006 where the sizes tell) or for late members
        severity = "medium"
    return [
        Finding(
            severity=severity,
            title=f"communication not hidden: {exposed:.0%} of the step waits on collectives"
            + _maybe_waiting_for(unrecorded)
            + (MEMBERS_UNKNOWN if members_unknown and not unrecorded else ""),
            evidence={
                **_unrecorded_evidence(unrecorded),
                **({"arrival_unknown": True} if members_unknown else {}),
                "exposed_comm_share": exposed,
                "comm_share": summary.get("comm_share"),
                "threshold": limits[severity],
                "waiting_for_stragglers": stragglers,
                **(
                    {
                        "measured_exposed_comm_share": summary.get("exposed_comm_share"),
                        "waiting_for_a_core_share": host_share,
                    }
                    if host_share
                    else {}
                ),
            },
            advice="more work per rank or fewer ranks on this dimension; keep TP/EP in a node; "
            "smaller DDP buckets start all-reduces earlier in backward",
        )
    ]


MEMBERS_UNKNOWN = (
    " (the layout unknown, so is how much of it is waiting for late members; --layout gives it)"
)


def unrecorded_peers(ctx: RuleContext, axis: str | None = None) -> list[int]:
    """The ranks of the world that left no records but share a group (of `axis`, or any)
    with ranks that did: the analysed ranks' collectives with them may be waiting for them,
    which no record shows (diag/whatif/late_members.py bounds it where sizes tell)."""
    analysed = {int(r) for r in ctx.metrics.ranks["rank"]} if not ctx.metrics.ranks.empty else set()
    if not analysed:
        return []
    incomplete = untraced_in_groups(ctx.run.manifest, analysed, at_least=1)
    found = {r for (name, _), missing in incomplete.items() if axis in (None, name)
             for r in missing}  # fmt: skip
    world = int(ctx.run.manifest.world_size)
    return sorted(r for r in found if 0 <= r < world)


def _unrecorded_evidence(unrecorded: list[int]) -> dict[str, object]:
    """The peers with no records, said as ranges (a 1,024-rank folder traced on one node has
    a thousand), and how many; nothing where there are none."""
    if not unrecorded:
        return {}
    return {"unrecorded_peers": ranks_phrase(unrecorded), "unrecorded_peer_count": len(unrecorded)}


def _maybe_waiting_for(unrecorded: list[int]) -> str:
    if not unrecorded:
        return ""
    return f" (some of it may be waiting for {ranks_phrase(unrecorded)}, which left no records)"


def waiting_for_a_core_share(ctx: RuleContext) -> float | None:
    """The share of the ranks' step time spent waiting for a core (diag/metrics/host.py), or
    None."""
    steps = ctx.metrics.host_steps
    return None if steps.empty else waiting_share(steps)


def _group_share(ctx: RuleContext, group: str) -> tuple[float, float] | None:
    """(time in `group` collectives, wall) per rank, averaged over ranks; None without them."""
    table = ctx.metrics.collectives
    ranks = ctx.metrics.ranks
    if table.empty or ranks.empty:
        return None
    rows = table[table["group"] == group]
    wall = float(ranks["wall_s"].mean())
    if rows.empty or wall <= 0:
        return None
    return float(rows["time_s"].sum()), wall


@rule(
    "COM002",
    "communication.tp_share",
    pattern=1,
    thresholds={
        "high": Threshold(0.50, "fraction", "share of the step in TP collectives: high"),
        "medium": Threshold(0.25, "fraction", "share of the step in TP collectives: medium"),
    },
)
def tp_comm_share(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Tensor parallelism spends the step in its collectives: the GEMMs got too small.

    Symptom:
        With tp > 1 a large share of every step is spent in the per-layer TP all-reduces
        (all-gathers / reduce-scatters under sequence parallelism).
    Likely cause:
        Each added TP rank shrinks every rank's GEMMs while the collectives keep their size
        (micro_batch x seq x hidden per all-reduce, 2 per layer forward and 2 backward), so the
        communication share rises with tp; worse when the TP group crosses a slow link.
    Fix:
        Lower the TP degree (use DP or PP for the remaining ranks), give each rank more work
        (larger micro-batch or sequence), keep TP inside a node, enable sequence parallelism.
    Evidence:
        Time in collectives of group `tp` per rank over its wall time, with tp and the ledger
        comparison summary.tp_vs_ledger.
    """
    tp = ctx.run.manifest.layout.tp or 1
    measured = _group_share(ctx, "tp")
    if tp <= 1 or measured is None:
        return []
    tp_s, wall_s = measured
    share = tp_s / wall_s
    severity = grade(share, limits)
    if severity is None:
        return []
    return [
        Finding(
            severity=severity,
            title=f"TP={tp} collectives take {share:.0%} of the step: per-rank GEMMs too small",
            evidence={
                "tp": tp,
                "tp_comm_share": share,
                "tp_comm_s_per_rank": tp_s,
                "wall_s_per_rank": wall_s,
                "tp_vs_ledger": ctx.metrics.summary.get("tp_vs_ledger"),
                "threshold": limits[severity],
            },
            advice=f"lower TP below {tp} and use DP/PP for the other ranks, or give each rank "
            "more work (micro-batch, sequence); keep TP inside a node; sequence parallelism",
        )
    ]


@rule(
    "COM003",
    "communication.dp_not_overlapped",
    pattern=1,
    thresholds={
        "max_hidden": Threshold(0.20, "fraction", "share of DP all-reduce time hidden: below"),
        "min_share": Threshold(0.10, "fraction", "DP all-reduce time over step wall: at least"),
        "medium": Threshold(0.10, "fraction", "share of the step hiding DP would save: medium"),
        "high": Threshold(0.40, "fraction", "share of the step hiding DP would save: high"),
    },
)
def dp_not_overlapped(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The DP gradient all-reduce does not hide behind backward.

    Symptom:
        Nearly all of the time the data-parallel all-reduces are in flight, the rank waits for
        them: exposed DP communication is about its total.
    Likely cause:
        Buckets too coarse (one bucket of the whole model starts only when backward ends), too
        little backward left to overlap with, or a synchronous all-reduce after backward.
    Fix:
        Smaller DDP buckets (`bucket_cap_mb`) so all-reduces start earlier in backward, overlap
        the reduction with backward, bf16 gradient reduction to halve the bytes.
    Evidence:
        Per rank, the union of group `dp` collectives, the part of it not spent waiting
        (hidden), and its share of the step wall time.
    """
    run = ctx.run
    # a large run keeps every record only in a window of steps: measure over those
    steps = whole_steps(ctx.metrics.rank_steps, run.span_steps)
    comms = run.comms[run.comms["group"] == "dp"]
    if comms.empty or steps.empty:
        return []
    comms = comms[in_steps(comms, steps)]
    waits = pd.concat([
        run.spans.loc[run.spans["phase"] == "comm_wait", ["rank", "t0", "t1"]],
        run.comms.loc[_blocking_all(run.comms), ["rank", "t0", "t1"]],
    ])  # fmt: skip
    waits = waits[intervals.overlapping(comms, waits)]  # only these can hide DP time
    # hidden = |dp \ waits| = |dp U waits| - |waits|, per rank, in integer ns
    either = intervals.union_length_by(pd.concat([comms[["rank", "t0", "t1"]], waits]), ["rank"])
    waiting = intervals.union_length_by(waits, ["rank"]).reindex(either.index, fill_value=0)
    dp_s = float(intervals.union_length_by(comms, ["rank"]).sum()) / NS_PER_S
    hidden_s = float((either - waiting).sum()) / NS_PER_S
    walls = steps.groupby("rank")["wall_s"].sum()  # as the rank table sums them
    wall_s = float(walls[walls.index.isin(comms["rank"])].sum())
    if dp_s <= 0 or wall_s <= 0:
        return []
    hidden, share = hidden_s / dp_s, dp_s / wall_s
    if hidden >= limits["max_hidden"] or share < limits["min_share"]:
        return []
    unrecorded = unrecorded_peers(ctx, "dp")
    return [
        Finding(
            severity="medium",
            title=f"DP all-reduce not overlapped: {1 - hidden:.0%} of it exposed, "
            f"{share:.0%} of the step" + _maybe_waiting_for(unrecorded),
            evidence={
                **_unrecorded_evidence(unrecorded),
                "dp_comm_share": share,
                "dp_hidden_fraction": hidden,
                "dp_comm_s": dp_s,
                "bucket_mb": run.manifest.layout.bucket_mb,
                "max_hidden": limits["max_hidden"],
            },
            advice="smaller DDP buckets (bucket_cap_mb) so all-reduces start during backward; "
            "reduce gradients in bf16",
        )
    ]


def _blocking_all(comms: pd.DataFrame) -> pd.Series:
    """`blocking` where recorded; otherwise blocking unless `async` is true (docs/metrics.md)."""
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool)
    return comms["blocking"].where(comms["blocking"].notna(), ~is_async).astype(bool)


EP_OPS = ("all_to_all",)
"""Expert all-to-alls are compared with their ledger by the MoE family."""


@rule(
    "COM004",
    "communication.bytes_vs_ledger",
    pattern=1,
    thresholds={
        "tolerance": Threshold(
            0.25, "ratio", "bytes off the ledger by more than 1+tol (or under 1/(1+tol))"
        ),
    },
)
def bytes_vs_ledger(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Collectives move far more (or fewer) bytes than the communication ledger expects.

    Symptom:
        A collective's measured bytes per rank differ from the ledger's expected bytes by more
        than the tolerance.
    Likely cause:
        Above: padding, duplicated or unbucketed gradients, fp32 where bf16 was planned, a
        collective issued more often than the schedule needs. Below: part of the model not
        reduced (frozen or unused parameters), a ledger out of date with the model.
    Fix:
        Check the dtype of the reduction, the bucketing, and which parameters need gradients;
        bring the ledger's model description in line with the run.
    Evidence:
        The `collectives` rows (op, group, tag) with bytes, expected_bytes and their ratio;
        expert all-to-alls are left to the MoE rules.
    """
    table = ctx.metrics.collectives
    if table.empty:
        return []
    high = 1 + limits["tolerance"]
    rows = table[table["ratio"].notna() & ~table["op"].isin(EP_OPS) & (table["group"] != "ep")]
    off = rows[(rows["ratio"] > high) | (rows["ratio"] < 1 / high)]
    if off.empty:
        return []
    # how far off either way; a collective that moved no bytes (ratio 0) is the farthest
    worst = off.loc[(off["ratio"].astype(float).apply(
        lambda r: max(r, 1 / r) if r > 0 else float("inf"))).idxmax()]  # fmt: skip
    return [
        Finding(
            severity="medium",
            title=f"{worst['op']} on {worst['group']} moves {float(worst['ratio']):.2f}x the "
            "ledger's bytes",
            evidence={
                "collectives": [
                    {
                        "op": r["op"],
                        "group": r["group"],
                        "tag": r["tag"],
                        "bytes": float(r["bytes"]),
                        "expected_bytes": float(r["expected_bytes"]),
                        "ratio": float(r["ratio"]),
                    }
                    for _, r in off.iterrows()
                ],
                "tolerance": limits["tolerance"],
            },
            advice="check the reduction dtype, bucketing and which parameters get gradients; "
            "update the ledger's model description if it is stale",
        )
    ]
