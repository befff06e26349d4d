"""The search for stragglers (diag/rules/families/balance.py, BAL001): ranks whose own busy time
per step stands out against their peers' while the peers wait for them, in enough steps; and
what the rules that defer to it read of a rank's excess (its waiting for a core, the part of
it that is its own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics import RunMetrics
from diag.metrics.host import busy_net_of_queueing, waiting_share
from diag.rules.costs import STRAGGLER_CAUSES, busy_cost_s, ranks_cost_s
from diag.rules.engine import Threshold
from diag.whatif.attribution import Attribution
from diag.whatif.scenarios import MAX_CANDIDATES

STRAGGLER_RULE = "BAL001"
"""The straggler rule, whose limits the rules that defer to it read."""

STRAGGLER_LIMITS = {
    "busy_ratio": Threshold(1.3, "ratio", "a rank's busy time over the median of its peers'"),
    "min_excess_s": Threshold(0.002, "s", "busy time per step above the peers' median: at least"),
    "min_step_share": Threshold(0.5, "fraction", "share of steps in which the rank stands out"),
    "min_steps": Threshold(
        2,
        "steps",
        "steps in which the rank stands out: at least, unless the replay says its excess costs "
        "min_cost_share of the step; steps analysed (replayed, for a straggler only the replay "
        "finds): at least",
    ),
    "high_ratio": Threshold(1.5, "ratio", "busy ratio at which the finding is high"),
    "min_cost_share": Threshold(
        0.10,
        "fraction",
        "share of the step the replay says one rank's excess costs: what names a straggler the "
        "busy times miss, or one that stands out in fewer than min_steps steps",
    ),
}


def median_of_the_others(values: np.ndarray) -> np.ndarray:
    """For each element, the median of all the others (n log n, not n^2: ranks run to 10^4)."""
    n = len(values)
    if n < 2:
        return np.full(n, np.nan)
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    m = n - 1  # the others, sorted, are `ranked` without one entry at `position`

    def others_at(j: np.ndarray) -> np.ndarray:
        return ranked[np.where(j < position, j, j + 1)]

    low = others_at(np.full(n, (m - 1) // 2))
    high = others_at(np.full(n, m // 2))
    return (low + high) / 2


def _peer_sets(ranks: pd.DataFrame) -> list[pd.DataFrame]:
    """Ranks that should be equally busy: all of them, or each pipeline stage's replicas."""
    if "stage" in ranks and ranks["stage"].notna().any():
        return [group for _, group in ranks.groupby("stage") if len(group) >= 2]
    return [ranks] if len(ranks) >= 2 else []


def _steps_standing_out(
    rank_steps: pd.DataFrame | None, rank: int, ratio: float
) -> tuple[float, int | None, int | None]:
    """The share and the number of steps in which `rank`'s busy time is at least `ratio` x
    the others' median, and the number of steps (share 1 and no numbers without per-step
    busy times)."""
    if rank_steps is None or rank_steps.empty:
        return 1.0, None, None
    table = rank_steps.pivot_table(index="step", columns="rank", values="busy_s")
    if rank not in table.columns or table.shape[1] < 2:
        return 1.0, None, None
    others = table.drop(columns=rank).median(axis=1)
    standing_out = table[rank] >= ratio * others
    return float(standing_out.mean()), int(standing_out.sum()), len(table)


def _replayed_cost_share(attribution: Attribution | None, rank: int) -> float | None:
    """The share of the step the replay says removing `rank`'s typical excess saves (its
    straggler and host causes); None without a replay."""
    if attribution is None or attribution.measured_step_s <= 0:
        return None
    return ranks_cost_s(attribution, [rank], STRAGGLER_CAUSES) / attribution.measured_step_s


NEGLIGIBLE_COST_SHARE = 0.01
"""A share of the step below which the replay's saving from a rank's compute excess is none."""


def _absorbed(
    attribution: Attribution | None, rank: int, min_steps: float, analysed: int | None
) -> bool:
    """The replay, over every analysed step (`analysed`; at least `min_steps`), says that
    bringing `rank`'s compute to its peers' saves the step nothing (below
    NEGLIGIBLE_COST_SHARE): nobody waited for its compute (the peers' waits were for
    something else), or its excess was host time (BAL005, HST001 name that). A rank busier
    than its peers by its ratio alone is then no straggler: a 4-rank job on 2 loaded cores
    read a healthy rank 1.34x its peers', costing 0.0 ms. A replay of some steps only (a
    large run's first ones) does not speak for the others, where the rank may stand out."""
    if attribution is None or attribution.measured_step_s <= 0 or analysed is None:
        return False
    if attribution.steps_replayed < max(min_steps, analysed):
        return False
    saved_s = busy_cost_s(attribution, [rank])
    return saved_s / attribution.measured_step_s < NEGLIGIBLE_COST_SHARE


LOADED_HOST_SHARE = 0.15
"""A share of the step the ranks waited for a core from which the host counts as loaded."""
LOADED_HOST_MIN_STEPS = 3
"""Steps a straggler must stand out in (or be replayed over) on a loaded host."""


def steps_needed(metrics: RunMetrics, limits: Mapping[str, float]) -> float:
    """`min_steps`, or at least LOADED_HOST_MIN_STEPS where the ranks waited for a core a
    LOADED_HOST_SHARE of the step: there the scheduler picks which rank it delays, and the
    same rank picked in both of two steps is chance often enough (a 4-rank run on 2 cores
    read a healthy rank as a straggler from its first two analysed steps)."""
    share = waiting_share(metrics.host_steps) if not metrics.host_steps.empty else None
    if share is not None and share >= LOADED_HOST_SHARE:
        return max(limits["min_steps"], LOADED_HOST_MIN_STEPS)
    return limits["min_steps"]


def own_busy(metrics: RunMetrics) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The ranks table and the per-step table with busy time net of the training thread's waiting
    for a core where the run recorded it (diag.metrics.host.busy_net_of_queueing)."""
    ranks, rank_steps = metrics.ranks, metrics.rank_steps
    if rank_steps is None or rank_steps.empty or metrics.host_steps.empty:
        return ranks, rank_steps
    own = busy_net_of_queueing(rank_steps, metrics.host_steps)
    queued = (rank_steps["busy_s"] - own["busy_s"]).groupby(rank_steps["rank"]).sum()
    busy = ranks["busy_s"] - ranks["rank"].map(queued).fillna(0.0)
    return ranks.assign(busy_s=busy.clip(lower=0.0)), own


def find_stragglers(
    metrics: RunMetrics, limits: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """Ranks whose busy time per step stands out against the median of their peers while the
    peers wait longer in collectives than they do, in enough steps (`min_step_share`, and
    `min_steps` unless the replay's attribution says the excess is costly); none when more
    than a minority stand out (that is imbalance, not a straggler). Busy time is the rank's
    own: its time waiting for a core, where recorded, is the host's (HST001). `limits`:
    BAL001's, its defaults when None."""
    if limits is None:
        limits = {key: t.default for key, t in STRAGGLER_LIMITS.items()}
    ranks, rank_steps = own_busy(metrics)
    queued = rank_steps is not metrics.rank_steps  # busy time net of the waiting for a core
    attribution = metrics.attribution
    gap_waiting = (
        attribution.gaps.set_index("rank")["waiting_s"]
        if attribution is not None and not attribution.gaps.empty
        else pd.Series(dtype=float)
    )
    min_steps = steps_needed(metrics, limits)
    found: list[dict[str, Any]] = []
    for peers in _peer_sets(ranks[ranks["steps"] > 0]):
        standing_out: list[dict[str, Any]] = []
        busy = (peers["busy_s"] / peers["steps"]).to_numpy(float)
        # waiting the replay read from time in no record (ranks resuming together) is waiting
        # in a collective nobody recorded: exposed as much as a recorded one
        inferred = peers["rank"].map(gap_waiting).fillna(0.0).to_numpy(float)
        exposed = (peers["exposed_comm_s"] / peers["steps"]).to_numpy(float) + inferred
        busy_others, exposed_others = median_of_the_others(busy), median_of_the_others(exposed)
        for i, rank in enumerate(peers["rank"].to_numpy()):
            median_busy = float(busy_others[i])
            excess_s = float(busy[i]) - median_busy
            if median_busy <= 0 or excess_s < limits["min_excess_s"]:
                continue
            ratio = float(busy[i]) / median_busy
            if ratio < limits["busy_ratio"] or float(exposed_others[i]) <= exposed[i]:
                continue
            standing_out.append({
                "rank": int(rank),
                "peers": [int(p) for p in peers["rank"].to_numpy() if int(p) != int(rank)],
                "net_of_queueing": queued,
                "busy_ratio": ratio,
                "busy_per_step_s": float(busy[i]),
                "peers_median_busy_per_step_s": median_busy,
                "exposed_comm_per_step_s": float(exposed[i]),
                "peers_median_exposed_comm_per_step_s": float(exposed_others[i]),
            })  # fmt: skip
        if len(standing_out) > max(1, (len(peers) - 1) // 2):
            continue  # more than a minority: imbalance, not stragglers
        for entry in standing_out:
            steps = rank_steps
            if steps is not None:
                steps = steps[steps["rank"].isin(peers["rank"])]
            share, count, analysed = _steps_standing_out(steps, entry["rank"],
                                                         limits["busy_ratio"])  # fmt: skip
            entry["steps_standing_out"] = share
            if share < limits["min_step_share"]:
                continue
            # where no more than MAX_CANDIDATES stand out, a rank the replay did not take as a
            # candidate had a typical excess under 1% of the step (scenarios.MIN_EXCESS_SHARE):
            # its saving, none, is known; past that, some were not replayed for the cap alone
            if len(standing_out) <= MAX_CANDIDATES and _absorbed(
                attribution, entry["rank"], min_steps, analysed
            ):
                continue
            if count is not None and analysed is not None and count < min_steps:
                # one slow step (of two, early in a live run) is what a loaded host's noise
                # makes too: named only when the replay says that excess costs the step, and
                # never from a single step (one measurement shows lateness, BAL003, not a
                # persistently slow rank)
                cost_share = _replayed_cost_share(attribution, entry["rank"])
                if analysed < min_steps or (
                    cost_share is not None and cost_share < limits["min_cost_share"]
                ):
                    continue
            found.append(entry)
    return found


def queued_excess_per_step_s(metrics: RunMetrics) -> dict[int, float]:
    """Per rank, how much longer per step its training thread waited for a core than its
    peers' median (empty where not recorded)."""
    on_host = metrics.host_steps
    if on_host.empty or on_host["thread_queued_s"].isna().all():
        return {}
    mean = on_host.groupby("rank")["thread_queued_s"].mean().fillna(0.0)
    others = median_of_the_others(mean.to_numpy(float))
    excess = np.clip(mean.to_numpy(float) - others, 0.0, None)
    return {int(r): float(e) for r, e in zip(mean.index, excess, strict=True)}


MIN_OWN_PART = 0.5
"""A replayed straggler's excess must be at least this much its own (not waiting for a core)."""


def own_part(cause: Any, queued: Mapping[int, float], excess_s: float | None = None) -> float:
    """The part of a replayed cause's excess per step (its typical excess, or `excess_s`) that
    is not its ranks' waiting for a core beyond their peers' (their mean: a stage's ranks each
    carry the stage's excess)."""
    if excess_s is None:
        excess_s = float(cause.evidence.get("typical_excess_per_step_s") or 0.0)
    if excess_s <= 0 or not cause.ranks:
        return 1.0
    waited = sum(queued.get(int(r), 0.0) for r in cause.ranks) / len(cause.ranks)
    return max(1.0 - waited / excess_s, 0.0)


PERSISTENT_RATIO = 1.1
"""Busy time over the peers' median from which a step counts as one the rank stands out in."""
PERSISTENT_SHARE = 0.8
"""Share of the analysed steps a persistent straggler stands out in."""


def persistent(metrics: RunMetrics, ranks: list[int], limits: Mapping[str, float]) -> bool:
    """Every rank of `ranks` busier than PERSISTENT_RATIO x its peers' median in at least
    PERSISTENT_SHARE of the steps, and in at least `steps_needed` of them."""
    table = metrics.ranks
    for rank in ranks:
        steps = metrics.rank_steps
        if steps is not None and "stage" in table and table["stage"].notna().any():
            stage = table.set_index("rank")["stage"]
            steps = steps[steps["rank"].map(stage) == stage.get(rank)]  # its peers: its stage's
        share, count, _ = _steps_standing_out(steps, rank, PERSISTENT_RATIO)
        if count is None or share < PERSISTENT_SHARE or count < steps_needed(metrics, limits):
            return False
    return bool(ranks)
