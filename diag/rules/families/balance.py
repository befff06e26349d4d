"""Balance rules (collapse pattern 3: speedup far below theory): stragglers and busy imbalance.
The search for stragglers that several rules read is diag/rules/stragglers.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from diag.metrics.arrival import arrivals
from diag.outputs.units import ranks_phrase
from diag.rules.costs import STRAGGLER_CAUSES, ranks_cost_s
from diag.rules.engine import Finding, RuleContext, Threshold, rule
from diag.rules.extra_time import COMPUTES, UNKNOWN, extra_time
from diag.rules.stragglers import (  # noqa: F401 (re-exported: the rules that defer to BAL001)
    LOADED_HOST_MIN_STEPS,
    LOADED_HOST_SHARE,
    MIN_OWN_PART,
    PERSISTENT_RATIO,
    PERSISTENT_SHARE,
    STRAGGLER_LIMITS,
    STRAGGLER_RULE,
    find_stragglers,
    median_of_the_others,
    own_busy,
    own_part,
    persistent,
    queued_excess_per_step_s,
    steps_needed,
)
from diag.whatif.causes import CauseKind


@rule(STRAGGLER_RULE, "balance.straggler", pattern=3, thresholds=STRAGGLER_LIMITS)
def straggler(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """One rank computes longer than its peers, and they wait for it in every collective.

    Symptom:
        A rank's busy (compute) time per step stands out against the median of the others, in
        most steps and in at least two (a single slow step only when the replay says its
        excess costs the step: one noisy step is not a straggler), and the others spend more
        time waiting in collectives than it does; where the replay covers every analysed
        step, bringing its compute to its peers' must save at least 1% of the step (else
        nobody waited for it: their waits were for something else, or its excess was host
        time).
    Likely cause:
        A slower or throttled device, a noisy neighbour on its host, more data or work on that
        rank (uneven shards, longer sequences), host-side stalls (data loading, GC) on it.
        Synchronous collectives are a barrier: every step runs at the slowest rank's pace.
    Fix:
        Inspect or replace the named rank's device/host, balance the data per rank, move data
        loading off the critical path; exclude the node if it is persistently slow.
    Evidence:
        busy_s per step of every rank, the straggler's ratio to its peers' median, and the
        peers' exposed communication against its own. Where the run recorded the training
        thread's run-queue wait, busy time is judged net of it: on a loaded host the rank the
        scheduler delays is chance, and that time is the host's (HST001); on a host whose
        ranks waited for a core 15% of the step or more, the rank must stand out in (or be
        replayed over) at least 3 steps. Waiting the replay read from the ranks' resuming
        together after time in no record counts as the peers' waiting. `extra_time` says
        what the excess was: "computes" only where it used a core (the steps' CPU time, on a
        CPU run) or the device (a trace's compute kernels), "sleeps or blocks outside compute"
        where it did not, "is busy" where neither was recorded; the title gives the two busy
        figures per step its ratio is of.
    """
    ranks = ctx.metrics.ranks
    if ranks.empty or len(ranks) < 2:
        return []
    found = stragglers(ctx)
    if not found:
        return _replayed_stragglers(ctx, limits)
    blamed = sorted(int(f["rank"]) for f in found)
    worst = max(found, key=lambda f: f["busy_ratio"])
    busy = ranks.set_index("rank")["busy_s"] / ranks.set_index("rank")["steps"]
    what = extra_time(ctx.metrics, ctx.run.manifest.device_type, worst["rank"], worst["peers"],
                      worst["busy_per_step_s"] - worst["peers_median_busy_per_step_s"])  # fmt: skip
    # the ratio's two figures, as the ranks table has them (busy per step), so the title can
    # be checked against it; net of the waiting for a core where that was taken out
    net = " net of waiting for a core" if worst.get("net_of_queueing") else ""
    figures = (f"{worst['busy_per_step_s'] * 1e3:.0f} ms busy per step{net} against "
               f"{worst['peers_median_busy_per_step_s'] * 1e3:.0f} ms")  # fmt: skip
    return [
        Finding(
            severity="high" if worst["busy_ratio"] >= limits["high_ratio"] else "medium",
            title=f"straggler: {ranks_phrase(blamed)} {what.phrase} "
            f"{worst['busy_ratio']:.2f}x its peers' time ({figures}) while they wait in "
            "collectives",
            ranks=blamed,
            evidence={
                "busy_s_per_step": {int(r): float(b) for r, b in busy.items()},
                "stragglers": found,
                "busy_ratio_threshold": limits["busy_ratio"],
                "extra_time": {"is": what.verb, **what.evidence},
            },
            advice=f"look at {ranks_phrase(blamed)}: its device, host load and data; balance "
            "the work per rank or exclude a persistently slow node",
            # a slow rank starts every collective last; and a persistent per-rank excess that
            # costs the step is a straggler, not random imbalance: where both are found, this
            # one leads (the same job read BAL004 once, BAL001 once on a loaded host)
            explains=["BAL003", *(["BAL004"] if _costly(ctx, blamed, limits) else [])],
        )
    ]


def stragglers(ctx: RuleContext) -> list[dict[str, Any]]:
    """`find_stragglers` at BAL001's limits as configured, once a run (BAL001, BAL002 and the
    rules that ask whether a straggler explains their finding all read it)."""
    limits = ctx.limits_of(STRAGGLER_RULE)
    if ctx.run.manifest.layout_unknown:  # whose peers a rank is (its stage, its role): unknown
        return []
    return list(ctx.derived_once("stragglers", lambda: find_stragglers(ctx.metrics, limits)))


def straggler_ranks(ctx: RuleContext) -> list[int]:
    """The ranks BAL001 names at its limits as configured, from the busy times or, where they
    miss it, from the replay: what other rules read as 'a straggler explains this'."""
    found = stragglers(ctx)
    if found:
        return sorted(int(f["rank"]) for f in found)
    limits = ctx.limits_of(STRAGGLER_RULE)
    return sorted({r for f in _replayed_stragglers(ctx, limits) for r in f.ranks})


def _costly(ctx: RuleContext, ranks: list[int], limits: Mapping[str, float]) -> bool:
    """The replay says removing the ranks' excess saves at least `min_cost_share` of the
    step (False without a replay)."""
    attribution = ctx.metrics.attribution
    if attribution is None or attribution.measured_step_s <= 0:
        return False
    cost = ranks_cost_s(attribution, ranks, STRAGGLER_CAUSES)
    return cost / attribution.measured_step_s >= limits["min_cost_share"]


def _replayed_stragglers(ctx: RuleContext, limits: Mapping[str, float]) -> list[Finding]:
    """Stragglers the busy times miss but the replay finds: one rank whose typical excess
    of compute over its peers' costs a share of the step (its busy time may be diluted by
    waits, or its peers' by their own noise)."""
    attribution = ctx.metrics.attribution
    if attribution is None or attribution.steps_replayed < steps_needed(ctx.metrics, limits):
        return []  # one replayed step cannot tell a persistent excess from that step's noise
    noise = attribution.cause(CauseKind.IMBALANCE)  # random per-step imbalance: BAL004's
    noise_s = noise.cost_s if noise else 0.0
    # a persistent straggler costs more than the per-step noise around it; otherwise a few
    # steps of random draws could name a rank (BAL004 says it)
    queued = queued_excess_per_step_s(ctx.metrics)
    # and one whose excess is mostly its waiting for a core is the host's (HST001); a rank
    # waking from a sleep on a loaded host queues more too, so a part of it does not count
    # unless the rank's excess persists: slower than its peers in nearly every step is a
    # straggler whatever the noise around it (a loaded host's noise made the same job read
    # BAL004 in one run and BAL001 in the next)
    causes = [c for c in attribution.causes if c.kind == CauseKind.STRAGGLER
              and c.cost_share >= limits["min_cost_share"]
              and (c.cost_s > noise_s or persistent(ctx.metrics, c.ranks, limits))
              and own_part(c, queued) >= MIN_OWN_PART]  # fmt: skip
    if not causes:
        return []
    blamed = sorted(r for c in causes for r in c.ranks)
    worst = max(causes, key=lambda c: c.cost_s)
    stage = ctx.metrics.ranks.set_index("rank").get("stage")
    rank = worst.ranks[0]
    peers = [int(r) for r in ctx.metrics.ranks["rank"] if int(r) != rank
             and (stage is None or stage.get(r) == stage.get(rank))]  # fmt: skip
    excess = float(worst.evidence.get("typical_excess_per_step_s") or 0.0)
    what = extra_time(ctx.metrics, ctx.run.manifest.device_type, rank, peers, excess)
    verb = "computes longer than" if what.verb == COMPUTES else f"{what.phrase} longer than"
    if what.verb == UNKNOWN:
        verb = "is slower than"
    return [
        Finding(
            severity="medium",
            title=f"straggler: {ranks_phrase(blamed)} {verb} its "
            f"peers; removing its excess saves {worst.cost_share:.0%} of the step",
            ranks=blamed,
            evidence={
                "replayed": [vars(c) for c in causes],
                "extra_time": {"is": what.verb, **what.evidence},
            },
            advice=f"look at {ranks_phrase(blamed)}: its device, host load and data; balance "
            "the work per rank or exclude a persistently slow node",
            explains=["BAL003", "BAL004"],
        )
    ]


@rule(
    "BAL003",
    "balance.late_arrival",
    pattern=3,
    thresholds={
        "min_matched": Threshold(4, "collectives", "collectives matched with peers: at least"),
        "last_share": Threshold(0.6, "fraction", "share of collectives the rank starts last"),
        "min_late_s": Threshold(0.002, "s", "median lateness behind the first rank: at least"),
        "late_ratio": Threshold(3.0, "ratio", "its median lateness over the other ranks' median"),
    },
)
def late_arrival(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """One rank starts most collectives last, well behind its peers, which wait for it.

    Symptom:
        Matched across ranks (the n-th collective of an op in a group), the rank starts last in
        most of them, and its median lateness behind the first rank to start is large and well
        above the other ranks'.
    Likely cause:
        Whatever delays the rank before it reaches the collective: more compute (see BAL001),
        a host-side stall (data loading, garbage collection, logging, checkpoint I/O), a slow
        CPU launch path, or, across hosts, clocks that disagree (profiler traces keep host
        clocks).
    Fix:
        Profile the named rank's host side before the collective (data loader workers, pinned
        memory, synchronous logging); if its compute also stands out, treat it as a straggler.
    Evidence:
        Per rank: collectives matched, median lateness (s) and the share started last. A
        rank whose extra waiting for a core (beyond its peers', where recorded) is more than
        half its lateness is the host's (HST001), not named here.
    """
    table = arrivals(ctx.run.comms, ctx.metrics.rank_steps, ctx.run.manifest)
    table = table[table["matched"] >= limits["min_matched"]]
    if len(table) < 2:
        return []
    others = median_of_the_others(table["late_median_s"].to_numpy(float))
    standing_out = (
        (table["last_share"].to_numpy() >= limits["last_share"])
        & (table["late_median_s"].to_numpy() >= limits["min_late_s"])
        & (table["late_median_s"].to_numpy() >= limits["late_ratio"] * others)
    )
    # a rank late by its waiting for a core beyond its peers' is the host's (HST001), not
    # its own: beside a CPU hog the scheduler makes some rank late in any healthy job
    queued = queued_excess_per_step_s(ctx.metrics)
    late_s = dict(zip(table["rank"].tolist(), table["late_median_s"].tolist(), strict=True))
    found = [
        int(r) for r in table["rank"].to_numpy()[standing_out]
        # the median collective's lateness: a rank late at each is late by about that a step
        if queued.get(int(r), 0.0) < (1.0 - MIN_OWN_PART) * late_s[r]
    ]  # fmt: skip
    if not found:
        return []
    worst = table.set_index("rank").loc[found, "late_median_s"].max()
    return [
        Finding(
            severity="medium",
            title=f"late arrival: {ranks_phrase(found)} starts collectives last, "
            f"{worst * 1e3:.1f} ms behind the first (median)",
            ranks=found,
            evidence={"arrivals": table.to_dict("records")},
            advice=f"look at what {ranks_phrase(found)} {'does' if len(found) == 1 else 'do'} "
            "before each collective: data loading, "
            "host stalls, launch path; compare their compute with BAL001",
        )
    ]


@rule(
    "BAL002",
    "balance.busy_imbalance",
    pattern=3,
    thresholds={
        "imbalance": Threshold(1.25, "ratio", "max over mean busy time across ranks: at least"),
    },
)
def busy_imbalance(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Ranks are unevenly busy, without one single straggler to blame.

    Symptom:
        The busiest rank's compute time is well above the mean over ranks
        (summary.busy_imbalance), while no single rank stands out as a straggler.
    Likely cause:
        Uneven work per rank: unbalanced data shards or sequence lengths, hot MoE experts on
        some ranks, heterogeneous devices, host contention spread over several ranks.
    Fix:
        Balance the data (length-bucketed batching), the experts (aux loss, capacity) or the
        placement; check the devices and host load of the busiest ranks.
    Evidence:
        The busiest rank's busy time over the mean (net of the training threads' waiting for
        a core where recorded; summary.busy_imbalance is the measured one) with busy_s per
        step of every rank. Pipeline runs are left to the stage-imbalance rule.
    """
    measured = ctx.metrics.summary.get("busy_imbalance")
    ranks, _ = own_busy(ctx.metrics)  # a rank the scheduler delayed is the host's (HST001)
    mean_busy = float(ranks["busy_s"].mean()) if len(ranks) else 0.0
    imbalance = float(ranks["busy_s"].max()) / mean_busy if mean_busy > 0 else None
    pp = ctx.run.manifest.layout.pp or 1
    if pp > 1 or imbalance is None or len(ranks) < 2 or imbalance < limits["imbalance"]:
        return []
    if ctx.run.manifest.layout_unknown:  # ranks of different roles need not be equally busy
        return []
    if stragglers(ctx):
        return []  # BAL001 names the rank (at its limits as configured)
    busiest = ranks[ranks["busy_s"] >= limits["imbalance"] * mean_busy]["rank"]
    if busiest.empty:
        busiest = ranks.loc[[ranks["busy_s"].idxmax()], "rank"]
    busy = ranks.set_index("rank")["busy_s"] / ranks.set_index("rank")["steps"]
    return [
        Finding(
            severity="medium",
            title=f"busy time uneven across ranks: max {imbalance:.2f}x the mean",
            ranks=sorted(int(r) for r in busiest),
            evidence={
                "busy_imbalance": imbalance,
                "measured_busy_imbalance": measured,
                "busy_s_per_step": {int(r): float(b) for r, b in busy.items()},
                "threshold": limits["imbalance"],
            },
            advice="balance the work per rank (data shards, sequence lengths, experts); check "
            "the busiest ranks' devices and host load",
        )
    ]
