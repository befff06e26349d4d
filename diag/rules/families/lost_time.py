"""Balance rules found by the replay (collapse pattern 3): time lost to random per-step
imbalance, and to one rank's host time, which the busy-time rules cannot see (diag/whatif)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from diag.outputs.units import ranks_phrase
from diag.rules.engine import Finding, RuleContext, Threshold, rule
from diag.whatif.causes import Cause, CauseKind

MIN_SHARE = Threshold(0.05, "fraction", "share of the step the cause costs: at least")


@rule("BAL004", "balance.random_imbalance", pattern=3, thresholds={"min_share": MIN_SHARE})
def random_imbalance(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Which rank is slowest changes from step to step, and every step waits for that one.

    Symptom:
        Replayed with every rank's local time at the mean of its stage's ranks in each step
        (the work balanced, none deleted), the step is much shorter; removing each rank's
        typical excess instead saves little: the slow rank of a step is a different one each
        time.
    Likely cause:
        Work that varies per batch: sequence lengths, padding, MoE routing, data augmentation;
        or noise on the hosts (interrupts, other processes). Synchronous collectives make every
        step as slow as its slowest rank, so per-rank noise adds up to lost time.
    Fix:
        Balance the work per batch (length-bucketed or packed sequences, fixed shapes), keep
        the hosts quiet (pin processes, isolate cores); fewer synchronisation points per step
        (larger gradient accumulation) average the noise out.
    Evidence:
        The counterfactual's saving (cost_s), the saving of every step balanced and of every
        rank's typical excess removed, and what removing the variation would save if it is
        noise rather than work (`if_noise_saves_s`: every piece of work at the quickest its
        stage ever did it; a bound, as varying work is no noise).
    """
    attribution = ctx.metrics.attribution
    cause = attribution.cause(CauseKind.IMBALANCE) if attribution else None
    if cause is None or cause.cost_share < limits["min_share"]:
        return []
    if_noise_s = float(cause.evidence.get("if_noise_saves_s", cause.cost_s))
    if_noise_share = cause.cost_share * if_noise_s / cause.cost_s
    return [
        Finding(
            severity="medium",
            title=f"random per-step imbalance: {cause.cost_share:.0%} of the step waits for "
            f"whichever rank is slowest that step (up to {if_noise_share:.0%} if the variation "
            "is noise, not work)",
            evidence=dict(cause.evidence),
            advice="balance the work per batch (length-bucketed or packed sequences, fixed "
            "shapes); keep the hosts quiet; accumulate gradients to synchronise less often",
            explains=["BAL002"],  # a rank late every time (BAL003) is not random
        )
    ]


@rule("BAL005", "balance.host_time", pattern=3, thresholds={"min_share": MIN_SHARE})
def host_time(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """One rank spends time on the host (data loading, outside the recorded work) while the
    others wait for it.

    Symptom:
        The rank reaches the collectives late, not because it computes longer: its time outside
        any compute span (data fetch, time between steps) exceeds its peers', and replaying it
        at their median shortens the step.
    Likely cause:
        A slow data loader on that rank (too few workers, remote storage, decoding), logging or
        checkpoint I/O, garbage collection, a busy host CPU.
    Fix:
        More data-loader workers with prefetch and pinned memory on the named rank's host,
        move logging and checkpointing off the critical path, check the host's load.
    Evidence:
        The counterfactual's saving (cost_s), split into what its host time and its compute
        at the peers' median would each save.
    """
    findings = []
    for cause in _worth_a_finding(ctx, CauseKind.HOST, limits):
        ranks = ranks_phrase(list(cause.ranks))
        findings.append(
            Finding(
                severity="medium",
                title=f"host time: {ranks} spends {cause.cost_share:.0%} of the step on "
                "the host (data loading, work outside the recorded spans) while peers wait",
                ranks=list(cause.ranks),
                evidence=dict(cause.evidence),
                advice=f"look at {ranks}'s data loader (workers, prefetch, pinned memory, "
                "storage) and host-side work between steps (logging, checkpoints, GC)",
                explains=["BAL003", "COM001", "COM003"],
            )
        )
    return findings


@rule("BAL006", "balance.untraced_member", pattern=3, thresholds={"min_share": MIN_SHARE})
def untraced_member(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Ranks wait in their collectives for a group member whose records are missing.

    Symptom:
        A group's collectives run far longer from their last traced member's arrival than
        collectives of the same op and at least as many bytes in other groups of the same
        axis (or in the same group, when nobody was late): the rest of that time is waiting
        for the members with no records, which the transfer alone cannot take. Likewise sends
        and receives to a peer with no records (a pipeline stage whose traces are lost) run
        far longer than the fastest message of the axis with as many bytes.
    Likely cause:
        The untraced rank is slow: a straggler, a host stall, a slow device or link; its own
        records (a trace file lost, a node not profiled) would say which.
    Fix:
        Record or trace the named rank (every rank of its group) and analyse again; meanwhile
        look at its host and device as for a straggler.
    Evidence:
        The counterfactual's saving (cost_s: the named members arriving with the last traced
        one, where a traced rank stood in for them too), the waiting ranks, the groups and
        the wait per step and its median per collective. Where a traced rank is its group's
        only one (one per tensor-parallel group traced), its persistent excess that is its
        waiting for the others stands for them: those members are named, not the rank. A
        lower bound: a transfer is bounded by the fastest
        collective of the same op with at least its bytes in a group of the same axis.
    """
    findings = []
    for cause in _worth_a_finding(ctx, CauseKind.UNTRACED, limits):
        missing = ranks_phrase(list(cause.ranks))
        waiting = ranks_phrase(list(cause.evidence.get("waiting_ranks", [])))
        groups = ", ".join(cause.evidence.get("groups", [])) or "their"
        # a step's whole wait: one long wait among many at the transfer's noise has a median
        # of microseconds (a one-per-TP trace: one of 9 TP all-reduces a step waits 30 ms)
        per_step = cause.evidence.get("wait_per_step_s")
        wait = (
            f"{float(per_step) * 1e3:.1f} ms a step"
            if per_step is not None
            else f"{float(cause.evidence.get('median_wait_s', 0.0)) * 1e3:.1f} ms (median)"
        )
        findings.append(
            Finding(
                severity="medium",
                title=f"waiting for an untraced rank: {waiting} wait {wait} "
                f"in {groups} communication for {missing}, which left no records",
                ranks=list(cause.ranks),
                evidence=dict(cause.evidence),
                advice=f"trace or record {missing} and analyse again; look at its host, "
                "device and data as for a straggler",
                explains=["BAL003", "COM001", "COM003"],
            )
        )
    return findings


def _worth_a_finding(ctx: RuleContext, kind: CauseKind, limits: Mapping[str, float]) -> list[Cause]:
    """The replay's causes of `kind` that cost at least the rule's `min_share` of the step
    (none without a replay)."""
    attribution = ctx.metrics.attribution
    if attribution is None:
        return []
    return [c for c in attribution.causes
            if c.kind == kind and c.cost_share >= limits["min_share"]]  # fmt: skip
