"""Host rules: time a rank was runnable but not running (waiting for a core) is the host's, not the
training's (diag/metrics/host.py). Pattern 3: the speedup is below theory because the ranks share
cores, with each other or with other work on the machine (HST001); or because the GPU waits for
its CPU to launch work (HST002, profiler traces: diag/metrics/device_time.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from diag.outputs.units import ranks_phrase
from diag.rules.engine import Finding, RuleContext, Threshold, grade, rule
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


STARVED_RULE = "HST002"
STARVED_THRESHOLDS = {
    "low": Threshold(0.05, "fraction", "share of the device's time idle waiting for its host: low"),
    "medium": Threshold(0.10, "fraction", "share waiting for the host: medium"),
    "high": Threshold(0.25, "fraction", "share waiting for the host: high"),
    "small_kernel_launches": Threshold(
        2.0,
        "ratio",
        "a median kernel at most this many times its launch's CPU time (or 10 us) is small: "
        "the CPU cannot launch kernels as fast as the GPU runs them",
    ),
    "many_kernels": Threshold(50, "kernels", "kernels per step from which small ones add up"),
    "gaps_before_kernels": Threshold(
        0.5,
        "fraction",
        "share of the small kernels preceded by a host gap from which they are the bottleneck",
    ),
    "slow_launch_us": Threshold(
        20.0, "us", "mean CPU time of a kernel launch from which the launches themselves are slow"
    ),
    "explains_share": Threshold(
        0.10, "fraction", "share of the host wait a cause must explain to be named"
    ),
}
SMALL_KERNEL_US = 10.0
"""A kernel this short is small whatever its launch costs (a launch takes ~5-10 us of CPU)."""


@rule(STARVED_RULE, "host.gpu_starved", pattern=3, thresholds=STARVED_THRESHOLDS)
def gpu_starved(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The GPU is starved by its host: it sits idle waiting for the CPU to launch work.

    Symptom:
        In a profiler trace, the device is idle between kernels that its CPU thread launched
        only after the previous kernel had ended (HTA's "host wait"): the GPU ran dry and
        waited. Idle time is large, compute small, and more GPUs or a faster GPU would not
        make the step shorter.
    Likely cause:
        Read from the trace, in order of the time it explains: the data loader's wait for the
        next batch (`enumerate(DataLoader)` events); many small kernels, each shorter than
        the CPU takes to launch it (the median kernel against the mean `cudaLaunchKernel`),
        so the CPU cannot keep up; slow launches themselves (tens of us each:
        `CUDA_LAUNCH_BLOCKING=1`, a tool hooking launches, a contended core); synchronising
        calls in the step (`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `.item()` as
        `aten::item` / `aten::_local_scalar_dense`),
        each of which drains the GPU's queue before the CPU launches again; else the CPU's
        own work between launches (Python, host-side code).
    Fix:
        For small kernels and launch overhead: capture the step in CUDA graphs
        (`torch.compile(mode="reduce-overhead")`, `torch.cuda.graphs`), fuse kernels with
        `torch.compile`, raise the (micro-)batch size so each kernel does more. For slow
        launches: unset `CUDA_LAUNCH_BLOCKING`, detach what hooks the launches, give the rank
        its cores. For synchronising calls: no `.item()`, `float(t)`, `print` of GPU tensors or
        `torch.cuda.synchronize()` in the step; keep metrics on the GPU and read them every N
        steps; `non_blocking=True` copies. For the loader: more `num_workers`,
        `pin_memory=True`, `prefetch_factor`.
    Evidence:
        Per rank, from its trace: the share of the device's time idle with the host to blame
        (the gaps between the device's busy runs, every stream together, whose next kernel
        was launched after the gap began), HTA's split of the idle time summed over streams
        (host wait, kernel wait, other), the step with and without that wait (its cost), the
        kernels per step and their median duration, the launches' mean CPU time, the
        synchronising calls and `.item()` reads per step, the data loader's wait. Profiler
        traces only: a run directory records no kernels.
    """
    table = ctx.metrics.device
    if table.empty or "device_host_wait_share" not in table:
        return []
    starved = table[table["device_host_wait_share"] >= limits["low"]]
    if starved.empty:
        return []
    ranks = sorted(int(r) for r in starved["rank"])
    typical = starved.median(numeric_only=True)
    share = float(typical["device_host_wait_share"])
    # the step as the report measures it (each step's device window) where the replay has
    # one, else the device's time per profiled step; the host's share of the device's time
    # is its share of the step
    measured = ctx.metrics.attribution.measured_step_s if ctx.metrics.attribution else 0.0
    step_s = measured if measured > 0 else float(typical["step_s"])
    cost_s = share * step_s
    severity = grade(share, limits) or "low"
    causes = starving_causes(typical, limits)
    fixes = list(dict.fromkeys(c.fix for c in causes))
    evidence: dict[str, Any] = {
        "ranks": ranks,
        "ranks_measured": len(table),
        "host_wait_share_of_device_time": share,
        "host_wait_share_by_rank": {
            int(r): float(v)
            for r, v in zip(starved["rank"], starved["device_host_wait_share"], strict=True)
        },
        "idle_share": float(typical["idle_share"]),
        "hta_idle_split": {
            "host_wait": _or_none(typical["host_wait_share"]),
            "kernel_wait": _or_none(typical["kernel_wait_share"]),
            "other": _or_none(typical["other_idle_share"]),
        },
        "step_s": step_s,
        "step_without_host_wait_s": step_s - cost_s,
        "device_time_per_step_s": float(typical["step_s"]),
        "host_wait_per_step_s": float(typical["host_wait_per_step_s"]),
        "kernels_per_step": _or_none(typical["kernels_per_step"]),
        "kernel_median_us": _or_none(typical["kernel_median_us"]),
        "launch_mean_us": _or_none(typical["launch_mean_us"]),
        "sync_calls_per_step": _or_none(typical["sync_calls_per_step"]),
        "scalar_reads_per_step": _or_none(typical["scalar_reads_per_step"]),
        "loader_per_step_s": _or_none(typical["loader_per_step_s"]),
        "host_gaps_per_step": _or_none(typical["host_gaps_per_step"]),
        "likely_causes": [c.name for c in causes],
        "causes_shown": [c.shows for c in causes],
        "counterfactual": "the device never waits for its host: each step without the idle "
        "gaps its host left (the median over the named ranks)",
    }
    everyone = len(ranks) == ctx.run.manifest.world_size and len(ranks) > 1
    where = "every rank" if everyone else ranks_phrase(ranks)
    title = (
        f"GPU starved by its host on {where}: idle {share:.0%} of its time waiting for the CPU "
        f"to launch work; the step would be {_ms(step_s - cost_s)} instead of {_ms(step_s)} "
        f"(likely: {causes[0].name})"
    )
    return [
        Finding(
            severity=severity,
            title=title,
            ranks=ranks,
            evidence=evidence,
            advice="; ".join(fixes),
            margin=share / limits["high"],
            # a GPU that waits for its CPU makes every collective and every gap look like
            # the device's: exposed communication and uneven device time follow from it. Only
            # a high finding claims them: a little host wait beside a communication-bound job
            # must not take the communication's severity and the first place
            explains=["COM001", "BAL004", *_explained_stragglers(ctx, ranks)]
            if severity == "high"
            else [],
            cost_s=cost_s,
            cost_share=share,
        )
    ]


def _explained_stragglers(ctx: RuleContext, starved: list[int]) -> list[str]:
    """BAL001 and BAL003 when every rank they blame is one whose GPU waits for its host: the
    rank is slow because its CPU cannot feed its GPU, and that is the diagnosis."""
    stragglers = straggler_ranks(ctx)
    return ["BAL001", "BAL003"] if stragglers and set(stragglers) <= set(starved) else []


class StarvingCause(NamedTuple):
    explains_s: float  # of the host wait per step
    name: str
    shows: str  # what the trace shows
    fix: str


_GRAPHS_FIX = (
    "CUDA graphs (torch.compile(mode='reduce-overhead'), torch.cuda.graphs) or torch.compile "
    "to fuse kernels; a larger (micro-)batch per kernel"
)
_SYNC_FIX = (
    "fewer syncs: no .item()/float()/print of GPU tensors or torch.cuda.synchronize() in the "
    "step (read metrics every N steps), non_blocking copies"
)
_LOADER_FIX = "more DataLoader workers (num_workers), pin_memory=True, a larger prefetch_factor"
_LAUNCH_FIX = (
    "unset CUDA_LAUNCH_BLOCKING, detach debuggers or tools that hook kernel launches, give the "
    "rank its own cores (HST001); fewer launches with CUDA graphs or torch.compile"
)
_CPU_FIX = (
    "profile the CPU side of the step; torch.compile or CUDA graphs take Python off the launch path"
)


def starving_causes(typical: pd.Series, limits: Mapping[str, float]) -> list[StarvingCause]:
    """The likely causes, the one that explains the most of the host wait first. What each
    explains, per step: the loader's wait; one host gap (the mean) per synchronising call;
    for small kernels or slow launches, the rest when a host gap precedes most kernels (the
    CPU issues them slower than the GPU runs them), else the CPU's time in the launches; the
    rest is the CPU's own work. Causes below `explains_share` are not named."""
    wait_s = _num(typical["host_wait_per_step_s"])
    gaps = _num(typical["host_gaps_per_step"])
    mean_gap_s = wait_s / gaps if gaps > 0 else 0.0
    found: list[StarvingCause] = []
    loader_s = _num(typical["loader_per_step_s"])
    if loader_s > 0:
        shows = f"the training thread waits {_ms(loader_s)} a step for its next batch"
        found.append(StarvingCause(loader_s, "a data-loader wait", shows, _LOADER_FIX))
    syncs = _num(typical["sync_calls_per_step"])
    if syncs >= 1:
        reads = _num(typical["scalar_reads_per_step"])
        of_which = f" ({reads:.0f} of them .item() reads)" if reads >= 1 else ""
        shows = (f"{syncs:.0f} synchronising calls a step{of_which}: each drains the GPU's "
                 "queue before the CPU launches again")  # fmt: skip
        found.append(
            StarvingCause(min(syncs, gaps) * mean_gap_s, "synchronising calls", shows, _SYNC_FIX)
        )
    median_us, launch_us = _num(typical["kernel_median_us"]), _num(typical["launch_mean_us"])
    per_step = _num(typical["kernels_per_step"])
    small = median_us <= max(limits["small_kernel_launches"] * launch_us, SMALL_KERNEL_US)
    slow = launch_us >= limits["slow_launch_us"]
    if slow or (small and per_step >= limits["many_kernels"]):
        # a host gap before most kernels: the CPU issues them slower than the GPU runs them,
        # and that explains whatever the loader and the syncs do not; else at least the
        # CPU's time in the launches themselves
        everywhere = gaps >= limits["gaps_before_kernels"] * per_step
        rest_s = wait_s - sum(c.explains_s for c in found)
        explains_s = max(rest_s if everywhere else 0.0, _num(typical["launch_per_step_s"]))
        share = f"; a host gap before {gaps / per_step:.0%} of them" if per_step else ""
        if slow:  # then every kernel is "small": the launch path is what is wrong
            shows = (f"each kernel launch takes {launch_us:.0f} us of CPU (a few us is usual: "
                     "CUDA_LAUNCH_BLOCKING=1, a tool hooking launches, a contended core)"
                     f"{share}")  # fmt: skip
            found.append(StarvingCause(explains_s, "slow kernel launches", shows, _LAUNCH_FIX))
        else:
            shows = (f"{per_step:.0f} kernels a step, the median {median_us:.0f} us, "
                     f"{launch_us:.1f} us of CPU to launch each{share}")  # fmt: skip
            found.append(StarvingCause(explains_s, "many small kernels", shows, _GRAPHS_FIX))
    rest_s = wait_s - sum(c.explains_s for c in found)
    shows = "the CPU thread is busy between launches (Python, host-side code)"
    found.append(StarvingCause(rest_s, "the CPU's own work between launches", shows, _CPU_FIX))
    named = [c for c in found if c.explains_s >= limits["explains_share"] * wait_s]
    return sorted(named or found[-1:], key=lambda c: -c.explains_s)


def _num(value: Any) -> float:
    return 0.0 if value is None or pd.isna(value) else float(value)


def _or_none(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
