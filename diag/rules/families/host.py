"""Host rules: time a rank was runnable but not running (waiting for a core) is the host's, not the
training's (diag/metrics/host.py). Pattern 3: the speedup is below theory because the ranks share
cores, with each other or with other work on the machine (HST001); or because the GPU waits for
its CPU to launch work (HST002, profiler traces: diag/rules/families/gpu_starved.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.rules.engine import Finding, RuleContext, Threshold, rule
from diag.rules.families.balance import (
    MIN_OWN_PART,
    PERSISTENT_RATIO,
    PERSISTENT_SHARE,
    STRAGGLER_RULE,
    own_part,
    queued_excess_per_step_s,
    steps_needed,
    straggler_ranks,
)
from diag.rules.families.gpu_starved import (  # noqa: F401 (re-exported: HST002 was here)
    SMALL_KERNEL_US,
    STARVED_RULE,
    STARVED_THRESHOLDS,
    StarvingCause,
    gpu_starved,
    starving_causes,
)
from diag.whatif.causes import Cause, CauseKind

HOST_RULE = "HST001"
HOST_TIME_RULE = "BAL005"  # a rank's host time (diag/rules/families/lost_time.py)
STAGE_RULE = "PIP003"  # a heavy pipeline stage (diag/rules/families/pipeline.py)


HOST_THRESHOLDS = {
    "low_share": Threshold(0.15, "fraction", "share of the step waited for a core: low"),
    "medium_share": Threshold(
        0.50, "fraction", "share of the step waited for a core: medium (not oversubscribed)"
    ),
    "high_share": Threshold(
        0.25,
        "fraction",
        "share of the step waited for a core at which ranks outnumbering the machine's "
        "cores are high (contention from other work stays medium: not the job's layout)",
    ),
    "others_cores": Threshold(
        0.5,
        "cores",
        "cores the ranks' threads left unused while they waited for one, to blame other "
        "work on a machine whose ranks do not outnumber its cores",
    ),
    "onset_ratio": Threshold(
        2.0, "ratio", "waiting share from a step on over before it, to say 'from step N'"
    ),
}
HOST_DEFAULTS = {key: t.default for key, t in HOST_THRESHOLDS.items()}


@rule(HOST_RULE, "host.descheduled_share", pattern=3, thresholds=HOST_THRESHOLDS)
def host_contention(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The ranks wait for a core: the host is oversubscribed or loaded by other work.

    Symptom:
        A share of each step the ranks' threads were runnable but not running (the run queue's
        wait in the step records), on a machine whose ranks outnumber its usable cores or
        that other processes load. Every timing of the run is inflated by it: compute looks
        slow, collectives look slow (their threads wait for a core too), steps look like a
        trend when the load starts midway.
    Likely cause:
        More compute-bound ranks (and their communication threads) than cores; intra-op
        thread pools larger than the cores each rank has; another job, a data loader's
        workers or a monitoring process on the same machine.
    Fix:
        Run fewer ranks per host (or give each its cores), pin each rank's threads to its own
        cores (`OMP_NUM_THREADS`, `torch.set_num_threads`, `taskset`/`numactl`), find and
        move the competing process; then measure again.
    Evidence:
        Per machine: ranks, usable cores, the share of step time waited for a core, the cores
        the ranks' threads kept busy, the step from which the waiting began (when it began
        midway). The cost is the replay's "every rank had its cores". Where BAL001 finds a
        straggler, the finding is low: a rank slower than its peers is the diagnosis, and
        the waiting they all share is its context (the timings are still inflated by it).
        So is it where the replay finds a fault of specific ranks, persistent and mostly
        their own rather than their waiting for a core beyond their peers': a rank's host
        time (BAL005: a loader stall) or a heavy pipeline stage (PIP003). Waiting for a core
        spread over every rank does not make one rank or stage slow; `context_for` names
        those faults, whose cost this one's overlaps (the replay's "every rank had its
        cores" shrinks their time too, a sleep or a stall included).
    """
    table = ctx.metrics.host
    if table.empty:
        return []
    # a rank slower than its peers on the same host is the diagnosis (BAL001), and so is a
    # rank's or a stage's own persistent excess: the waiting for a core is shared by all of
    # them and is context there, never ahead of it
    faults = own_faults(ctx)
    stragglers = straggler_ranks(ctx) or sorted({r for ranks in faults.values() for r in ranks})
    findings = []
    for row in table.itertuples(index=False):
        share = float(row.descheduled_share)
        if share < limits["low_share"]:
            continue
        oversubscribed = bool(row.oversubscribed)
        if not oversubscribed and not _others_took_cores(row, limits):
            continue  # the job's own threads on as many cores as ranks: its own, not the host's
        if stragglers:
            severity = "low"  # context for the straggler, which stays the main finding
        elif oversubscribed and share >= limits["high_share"]:
            severity = "high"
        else:
            severity = "medium" if share >= limits["medium_share"] else "low"
        onset = onset_step(ctx.metrics.host_steps, list(row.ranks), limits)
        finding = _finding(row, share, severity, oversubscribed and not stragglers, onset)
        if faults:
            finding.evidence["context_for"] = faults
        findings.append(finding)
    return findings


def own_faults(ctx: RuleContext) -> dict[str, list[int]]:
    """The faults of specific ranks the replay finds beside the waiting for a core, by the
    rule that names them: a rank's host time (BAL005's cause) or a pipeline stage's excess
    (PIP003's), each costing what its rule needs to name it, replayed over enough steps
    (`steps_needed`), persistent (the rank's host time, or the stage's busy time, stands out
    in most steps) and mostly their own: at most half of the excess is their waiting for a
    core beyond their peers'."""
    attribution = ctx.metrics.attribution
    if attribution is None or attribution.measured_step_s <= 0:
        return {}
    limits = ctx.limits_of(STRAGGLER_RULE)
    if attribution.steps_replayed < steps_needed(ctx.metrics, limits):
        return {}
    queued = queued_excess_per_step_s(ctx.metrics)
    host_share = ctx.limits_of(HOST_TIME_RULE)["min_share"]
    stage_share = ctx.limits_of(STAGE_RULE)["min_cost_share"]
    found: dict[str, list[int]] = {}
    for cause in attribution.causes:
        if not cause.ranks:
            continue
        if (cause.kind == CauseKind.HOST and cause.cost_share >= host_share
                and own_part(cause, queued) >= MIN_OWN_PART
                and _host_time_persists(ctx, cause.ranks, limits)):  # fmt: skip
            found.setdefault(HOST_TIME_RULE, []).extend(cause.ranks)
        elif (cause.kind == CauseKind.STAGE and cause.cost_share >= stage_share
              and _own_stage(ctx, cause, queued, limits)):  # fmt: skip
            found.setdefault(STAGE_RULE, []).extend(cause.ranks)
    return {rule_: sorted(set(ranks)) for rule_, ranks in found.items()}


NS_PER_S = 1e9


def _host_time_persists(ctx: RuleContext, ranks: list[int], limits: Mapping[str, float]) -> bool:
    """Each of `ranks` spends more time on the host than its peers (their median) by BAL001's
    `min_excess_s` and by PERSISTENT_RATIO, in PERSISTENT_SHARE of the steps and in
    `steps_needed` of them: its time between the previous step's end and this step's start
    and in its data spans. On a loaded host the rank the scheduler keeps off a core between
    two steps changes from step to step; a loader that stalls one rank does it every step."""
    steps = ctx.run.steps
    if steps.empty:
        return False
    steps = steps[["rank", "step", "t0", "t1"]].sort_values(["rank", "step"])
    before = steps["t0"] - steps.groupby("rank")["t1"].shift()
    table = steps.assign(host_s=before.to_numpy(dtype=np.float64) / NS_PER_S).dropna()
    spans = ctx.run.spans
    data = spans[spans["phase"] == "data"]
    if not data.empty:
        fetched = ((data["t1"] - data["t0"]) / NS_PER_S).groupby([data["rank"], data["step"]]).sum()
        keys = pd.MultiIndex.from_arrays([table["rank"], table["step"]])
        table = table.assign(host_s=table["host_s"] + fetched.reindex(keys).fillna(0.0).to_numpy())
    wide = table.pivot_table(index="step", columns="rank", values="host_s")
    needed = steps_needed(ctx.metrics, limits)
    for rank in ranks:
        if rank not in wide.columns or wide.shape[1] < 2:
            return False
        others = wide.drop(columns=rank).median(axis=1)
        floor = np.maximum(PERSISTENT_RATIO * others, others + limits["min_excess_s"])
        standing_out = (wide[rank] >= floor)[wide[rank].notna()]
        if standing_out.empty or standing_out.mean() < PERSISTENT_SHARE:
            return False
        if int(standing_out.sum()) < needed:
            return False
    return bool(ranks)


def _own_stage(
    ctx: RuleContext, cause: Cause, queued: Mapping[int, float], limits: Mapping[str, float]
) -> bool:
    """The stage's excess over the other stages' mean is mostly its own, and its ranks' busy
    time (their median) is PERSISTENT_RATIO x the other stages' ranks' (their median) in
    PERSISTENT_SHARE of the steps and in `steps_needed` of them."""
    local = float(cause.evidence.get("stage_local_s") or 0.0)
    others = float(cause.evidence.get("mean_stage_local_s") or 0.0)
    if own_part(cause, queued, local - others) < MIN_OWN_PART:
        return False
    steps = ctx.metrics.rank_steps
    if steps is None or steps.empty:
        return False
    table = steps.pivot_table(index="step", columns="rank", values="busy_s")
    mine = [r for r in cause.ranks if r in table.columns]
    rest = [r for r in table.columns if r not in set(cause.ranks)]
    if not mine or not rest:
        return False
    standing_out = table[mine].median(axis=1) >= PERSISTENT_RATIO * table[rest].median(axis=1)
    count = int(standing_out.sum())
    return bool(
        standing_out.mean() >= PERSISTENT_SHARE and count >= steps_needed(ctx.metrics, limits)
    )


def _others_took_cores(row: Any, limits: Mapping[str, float]) -> bool:
    """Whether other work took cores from the ranks: they waited for a core while their own
    threads kept fewer cores busy than the machine gives them (unknown counts count as yes)."""
    if row.usable_cores is None or row.cores_busy is None or pd.isna(row.cores_busy):
        return True
    return float(row.usable_cores) - float(row.cores_busy) >= limits["others_cores"]


def _finding(
    row: Any, share: float, severity: str, explains_waiting: bool, onset: int | None
) -> Finding:
    oversubscribed = bool(row.oversubscribed)
    cores = row.usable_cores
    if oversubscribed:
        why = f"{len(row.ranks)} ranks on {cores} cores"
        advice = (
            "run fewer ranks per host or give each rank its cores (pin threads: "
            "OMP_NUM_THREADS, torch.set_num_threads, taskset/numactl); every timing of this "
            "run is inflated by the waiting"
        )
    else:
        why = "other work on the machine" if onset is None else f"other work from step {onset}"
        advice = (
            "find and move the competing process (or pin the ranks to cores it does not use), "
            "then measure again: every timing of this run is inflated by the waiting"
        )
    since = f" from step {onset}" if onset is not None else ""
    evidence: dict[str, Any] = {
        "machine": row.machine,
        "ranks_on_machine": len(row.ranks),
        "usable_cores": cores,
        "oversubscribed": oversubscribed,
        "waiting_for_a_core_share": share,
        "waiting_for_a_core_per_step_s": float(row.descheduled_per_step_s),
        "cores_busy": None if pd.isna(row.cores_busy) else float(row.cores_busy),
        "from_step": onset,
        "timings_inflated": True,
    }
    return Finding(
        severity=severity,
        title=f"host {row.machine}: ranks wait for a core {share:.0%} of the step{since} ({why})",
        ranks=list(row.ranks),
        evidence=evidence,
        advice=advice,
        # ranks outnumbering the cores make the collectives and the per-step noise slow (unless
        # a straggler explains the waiting); other work on the machine may only share the
        # blame. A trend is the host's only where the waiting began midway: a load spread
        # over the run slows every step alike, and a rise TRD001 finds in the ranks' own
        # time is the training's (TRD001 itself reads a host trend as low)
        explains=(["COM001", "BAL004"] if explains_waiting else [])
        + (["TRD001"] if onset is not None else []),
    )


def onset_step(steps: pd.DataFrame, ranks: list[int], limits: Mapping[str, float]) -> int | None:
    """The step from which the ranks waited for a core much more than before (a load that
    started midway), or None when the waiting is spread over the run: the split of the steps
    into a before and an after that best separates the per-step waiting share."""
    mine = steps[steps["rank"].isin(ranks)].dropna(subset=["descheduled_s"])
    per_step = mine.groupby("step")[["descheduled_s", "wall_s"]].sum().sort_index()
    if len(per_step) < 6:
        return None
    share = (per_step["descheduled_s"] / per_step["wall_s"].where(per_step["wall_s"] > 0)).fillna(0)
    values = share.to_numpy()
    n = len(values)
    at = np.arange(2, n - 1)  # each split keeps at least two steps on each side
    total = np.concatenate([[0.0], np.cumsum(values)])
    before, after = total[at] / at, (total[n] - total[at]) / (n - at)
    gain = (after - before) * np.sqrt(at * (n - at))  # a two-sample contrast
    gain[(after < limits["onset_ratio"] * np.maximum(before, 1e-9)) | (gain <= 0)] = -np.inf
    best = int(np.argmax(gain))  # the first of equal gains, as a scan from the start finds
    if not np.isfinite(gain[best]) or after[best] < limits["low_share"]:
        return None
    return int(share.index[at[best]])
