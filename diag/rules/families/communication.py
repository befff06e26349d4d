"""Communication rules (collapse pattern 1: more GPUs, slower)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from diag.rules.engine import Finding, RuleContext, Threshold, rule


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
        summary.exposed_comm_share and comm_share against the thresholds.
    """
    summary = ctx.metrics.summary
    exposed = summary.get("exposed_comm_share")
    if exposed is None or exposed < limits["medium"]:
        return []
    severity = "high" if exposed >= limits["high"] else "medium"
    return [
        Finding(
            rule="COM001",
            pattern=1,
            severity=severity,
            title=f"communication not hidden: {exposed:.0%} of the step waits on collectives",
            evidence={
                "exposed_comm_share": exposed,
                "comm_share": summary.get("comm_share"),
                "threshold": limits[severity],
            },
            advice="more work per rank or fewer ranks on this dimension; keep TP/EP in a node; "
            "smaller DDP buckets start all-reduces earlier in backward",
        )
    ]
