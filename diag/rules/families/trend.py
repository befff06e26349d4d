"""Trend rules (collapse pattern 2: throughput decays over steps; memory creep toward an OOM).

Trends are robust slopes, never two points: the Theil-Sen slope (median of the pairwise slopes)
with Sen's confidence bound from the Mann-Kendall variance (Sen 1968, JASA 63:1379).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.metrics.common import in_rank_step_order
from diag.metrics.experts import layer_label
from diag.numeric.ordering import run_starts
from diag.rules.engine import Finding, RuleContext, Threshold, rule
from diag.rules.families.host import HOST_DEFAULTS, onset_step

_STEP_THRESHOLDS = {
    "min_steps": Threshold(8, "steps", "analysed steps needed before a trend is judged"),
    "z": Threshold(1.96, "z-score", "confidence of the slope's lower bound (1.96: 95%, two-sided)"),
    "medium": Threshold(0.15, "fraction", "step-time growth over the run (slope x steps / median)"),
    "high": Threshold(0.50, "fraction", "step-time growth over the run: high"),
    "cause_growth": Threshold(0.20, "fraction", "growth of a cause (a2a bytes) to name it"),
    "skew_growth": Threshold(1.15, "ratio", "expert max/mean last over first to name skew growth"),
}
_CREEP_THRESHOLDS = {
    "min_points": Threshold(4, "records", "memory records per rank needed to judge a trend"),
    "z": Threshold(1.96, "z-score", "confidence of the slope's lower bound (1.96: 95%, two-sided)"),
    "monotonic": Threshold(0.80, "fraction", "share of record-to-record changes that are rises"),
    "medium": Threshold(0.20, "fraction", "growth of one category over the run (fitted / first)"),
    "high": Threshold(1.00, "fraction", "growth of one category over the run: high"),
}
_CREEP_DEFAULTS = {key: t.default for key, t in _CREEP_THRESHOLDS.items()}


@dataclass(frozen=True)
class Slope:
    per_step: float  # Theil-Sen slope, units per step
    lower: float  # Sen's lower confidence bound of the slope
    growth: float  # fitted change over the span / the series' median (or its first value)


MAX_TREND_POINTS = 512
"""A longer series is fitted on this many points, each the median of consecutive ones: the
pairwise slopes are n^2/2 (at 10,000 steps 50 million, 7.5 s and 2 GB), the medians' are
131,000 whatever the run's length."""


def theil_sen(x: np.ndarray, y: np.ndarray, z: float, base: float | None = None) -> Slope | None:
    """The Theil-Sen slope of y over x, its lower bound at `z`, and the relative growth.

    None with fewer than 3 points or a zero `base` (default: the median of y). Over
    MAX_TREND_POINTS points, the slope and its bound are those of the medians of consecutive
    runs of points (x and y each), `base` and the span of x those of every point.
    """
    n = len(x)
    if n < 3:
        return None
    span = float(x.max() - x.min())
    base = float(np.median(y)) if base is None else base
    if n > MAX_TREND_POINTS:
        x, y = _medians_of_runs(x, y, MAX_TREND_POINTS)
        n = len(x)
    i, j = np.triu_indices(n, k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    slopes = np.sort((y[j] - y[i])[keep] / dx[keep])
    if len(slopes) == 0:
        return None
    variance = n * (n - 1) * (2 * n + 5) / 18  # Mann-Kendall S, no ties
    lower_rank = math.floor((len(slopes) - z * math.sqrt(variance)) / 2)
    lower = float(slopes[lower_rank]) if lower_rank >= 0 else -math.inf
    per_step = float(np.median(slopes))
    if base == 0:
        return None
    return Slope(per_step, lower, per_step * span / base)


def _medians_of_runs(x: np.ndarray, y: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """`points` points: the medians of x and of y over consecutive runs of the points in x
    order (runs of equal length, within one)."""
    order = np.argsort(x, kind="stable")
    bounds = np.linspace(0, len(x), points + 1).astype(np.int64)
    return _run_medians(x[order], bounds), _run_medians(y[order], bounds)


def _run_medians(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """The median of each run `values[bounds[i]:bounds[i + 1]]` (none empty), by `np.median`
    over the rows of one array per run length (the runs are of two lengths at most), not one
    call per run."""
    starts, lengths = bounds[:-1], np.diff(bounds)
    medians = np.empty(len(starts))
    for length in np.unique(lengths):
        runs = lengths == length
        medians[runs] = np.median(values[starts[runs][:, None] + np.arange(length)], axis=1)
    return medians


_WALL_PARTS = {"busy_s": "compute", "exposed_comm_s": "exposed communication", "idle_s": "idle"}


def growing_part(ctx: RuleContext, z: float) -> str | None:
    """Which part of the slowest rank's step (compute, exposed communication, idle) grows
    fastest, when one grows significantly."""
    rank_steps = ctx.metrics.rank_steps
    slowest = rank_steps.loc[rank_steps.groupby("step")["wall_s"].idxmax()].sort_values("step")
    x = slowest["step"].to_numpy(float)
    best: tuple[float, str] | None = None
    for column, part in _WALL_PARTS.items():
        slope = theil_sen(x, slowest[column].to_numpy(float), z, base=1.0)
        if slope is not None and slope.lower > 0 and (best is None or slope.per_step > best[0]):
            best = (slope.per_step, part)
    return best[1] if best else None


def step_walls(ctx: RuleContext) -> pd.Series:
    """Per analysed step, the slowest rank's wall time (s), indexed by step."""
    rank_steps = ctx.metrics.rank_steps
    if rank_steps.empty:
        return pd.Series(dtype=float)
    return rank_steps.groupby("step")["wall_s"].max().sort_index()


def own_walls(ctx: RuleContext) -> pd.Series | None:
    """Per analysed step, the slowest rank's wall time less its time waiting for a core
    (diag/metrics/host.py): the step the training itself took; None where that was not recorded."""
    host = ctx.metrics.host_steps
    if host.empty or host["descheduled_s"].isna().all():
        return None
    own = host["wall_s"] - host["descheduled_s"].fillna(0.0)
    return own.groupby(host["step"]).max().sort_index()


@dataclass(frozen=True)
class Creep:
    rank: int
    field: str  # a memory category or host_rss
    first_bytes: float
    last_bytes: float
    slope: Slope


def memory_creeps(ctx: RuleContext, limits: Mapping[str, float]) -> list[Creep]:
    """Memory fields that grow steadily over steps, per rank (categories first, then host_rss)."""
    memory = ctx.metrics.memory_steps
    found: list[Creep] = []
    if memory.empty:
        return found
    if not in_rank_step_order(memory):
        memory = memory.sort_values(["rank", "step"], kind="stable")
    all_ranks, all_steps = memory["rank"].to_numpy(np.int64), memory["step"].to_numpy(float)
    for name in (*schema.MEMORY_CATEGORIES, "host_rss"):
        if name not in memory:
            continue
        recorded = memory[name].notna().to_numpy()
        ranks, x, y = all_ranks, all_steps, memory[name].to_numpy(dtype=float, na_value=np.nan)
        if not recorded.all():
            ranks, x, y = ranks[recorded], x[recorded], y[recorded]
        for rank, start, stop in _creep_candidates(ranks, y, limits):
            slope = theil_sen(x[start:stop], y[start:stop], limits["z"], base=float(y[start]))
            if slope is not None and slope.lower > 0 and slope.growth >= limits["medium"]:
                found.append(Creep(rank, name, float(y[start]), float(y[stop - 1]), slope))
    return sorted(found, key=lambda c: c.rank)


def _creep_candidates(
    ranks: np.ndarray, values: np.ndarray, limits: Mapping[str, float]
) -> list[tuple[int, int, int]]:
    """The ranks whose series (`values`, the rows of a rank contiguous, ranks ascending) could
    creep, by the cheap tests (enough points, a positive first value, rising record to record
    often enough, not constant), all ranks at once: (rank, first row, row after its last)."""
    if len(ranks) == 0:
        return []
    starts = run_starts(ranks)
    stops = np.r_[starts[1:], len(ranks)]
    points = stops - starts
    rising = np.r_[False, values[1:] >= values[:-1]]
    rising[starts] = False  # a rank's first record rises from nothing
    rises = np.add.reduceat(rising.astype(np.int64), starts) / np.clip(points - 1, 1, None)
    spread = np.maximum.reduceat(values, starts) - np.minimum.reduceat(values, starts)
    keep = (
        (points >= limits["min_points"])
        & (values[starts] > 0)
        & (rises >= limits["monotonic"])
        & (spread > 0)
    )
    return [(int(ranks[i]), int(i), int(j)) for i, j in zip(starts[keep], stops[keep], strict=True)]


def _main_creep(creeps: list[Creep]) -> tuple[Creep, list[int]] | None:
    """The creep to name (a category before host_rss, then the fastest) and its ranks."""
    if not creeps:
        return None
    in_categories = [c for c in creeps if c.field != "host_rss"] or creeps
    top = max(in_categories, key=lambda c: c.slope.per_step)
    return top, sorted({c.rank for c in creeps if c.field == top.field})


def _alltoall_growth(ctx: RuleContext, z: float) -> Slope | None:
    """The trend of all-to-all bytes per step (median over ranks), analysed steps only."""
    totals = ctx.metrics.comm_totals
    a2a = totals[totals["op"] == schema.CollectiveOp.ALL_TO_ALL.value]
    keys = ctx.metrics.rank_steps[["rank", "step"]]
    a2a = a2a.merge(keys, on=["rank", "step"], how="inner")
    if a2a.empty:
        return None
    per_step = a2a.groupby(["step", "rank"])["bytes"].sum().groupby("step").median()
    return theil_sen(per_step.index.to_numpy(float), per_step.to_numpy(float), z)


def _skew_growth(ctx: RuleContext) -> tuple[int | str, float, float] | None:
    """The MoE layer whose max/mean load grew most from first to last step."""
    experts = ctx.metrics.experts
    if experts.empty:
        return None
    rows = experts.dropna(subset=["max_over_mean_first", "max_over_mean_last"])
    if rows.empty:
        return None
    ratio = rows["max_over_mean_last"] / rows["max_over_mean_first"]
    row = rows.loc[ratio.idxmax()]
    return (
        layer_label(row["layer"]),
        float(row["max_over_mean_first"]),
        float(row["max_over_mean_last"]),
    )


@rule("TRD001", "trend.step_time", pattern=2, thresholds=_STEP_THRESHOLDS)
def step_time_trend(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Step time rises steadily over the run: throughput decays.

    Symptom:
        The per-step wall time has a significant upward trend: the Theil-Sen slope's lower
        confidence bound is above zero and the fitted growth over the run is large.
    Likely cause:
        Memory creeping toward the peak (a leak, a list of losses kept with their graphs,
        allocator fragmentation), MoE hot experts growing all-to-all bytes, router skew worsening.
    Fix:
        Remove what creeps (keep `loss.item()`, not the loss), cap fragmentation with allocator
        settings, rebalance experts (aux-loss coefficient, capacity factor).
    Evidence:
        Slope (s/step) and its lower bound over the slowest rank's step walls, growth over the
        run, the part of the step that grows (compute, exposed communication or idle), and the
        named cause: the creeping memory field, all-to-all bytes growth, expert skew.
    """
    walls = step_walls(ctx)
    if len(walls) < limits["min_steps"]:
        return []
    slope = theil_sen(walls.index.to_numpy(float), walls.to_numpy(float), limits["z"])
    if slope is None or slope.lower <= 0 or slope.growth < limits["medium"]:
        return []
    if _the_hosts(ctx, walls, limits):
        return [_host_trend(slope, len(walls))]  # the host's waiting grew, not the work
    causes: list[str] = []
    explains: list[str] = []  # the findings each named cause accounts for
    evidence: dict[str, object] = {
        "slope_s_per_step": slope.per_step,
        "slope_lower_s_per_step": slope.lower,
        "growth": slope.growth,
        "steps": len(walls),
        "median_step_s": float(walls.median()),
    }
    ranks: list[int] = []
    creep = _main_creep(memory_creeps(ctx, {**_CREEP_DEFAULTS, "z": limits["z"]}))
    if creep is not None:
        top, ranks = creep
        causes.append(f"memory creep in {top.field}")
        explains.append("TRD002")
        evidence["memory_creep"] = {"field": top.field, "growth": top.slope.growth}
    a2a = _alltoall_growth(ctx, limits["z"])
    if a2a is not None and a2a.lower > 0 and a2a.growth >= limits["cause_growth"]:
        causes.append("growing all-to-all bytes")
        explains += ["MOE004", "COM001"]
        evidence["alltoall_bytes_growth"] = a2a.growth
    skew = _skew_growth(ctx)
    if skew is not None and skew[2] >= limits["skew_growth"] * skew[1]:
        causes.append(f"growing expert skew (layer {skew[0]})")
        explains += ["MOE002", "BAL001", "BAL002"]  # the hot expert's rank computes longest
        evidence["expert_max_over_mean"] = {"layer": skew[0], "first": skew[1], "last": skew[2]}
    evidence["causes"] = causes
    evidence["grows_in"] = part = growing_part(ctx, limits["z"])
    severity = "high" if slope.growth >= limits["high"] else "medium"
    where = f", in {part}" if part else ""
    because = f": {', '.join(causes)}" if causes else f"{where} (no cause in memory or experts)"
    return [
        Finding(
            severity=severity,
            title=f"step time grows {slope.growth:.0%} over {len(walls)} steps{because}",
            ranks=ranks,
            evidence=evidence,
            advice="find what grows with the step: keep `loss.item()` rather than the loss, "
            "set allocator options against fragmentation, rebalance hot experts",
            explains=explains,
        )
    ]


def _rises(walls: pd.Series, limits: Mapping[str, float]) -> bool:
    slope = theil_sen(walls.index.to_numpy(float), walls.to_numpy(float), limits["z"])
    return slope is not None and slope.lower > 0 and slope.growth >= limits["medium"]


def _the_hosts(ctx: RuleContext, walls: pd.Series, limits: Mapping[str, float]) -> bool:
    """Whether the host explains a rising step time: the step less its waiting for a core is
    flat, or the rise is a step at the point the waiting began (other work started on the
    machine: a contended core also computes slower, so the work's own time jumps there too)
    with no trend before it or after it."""
    own = own_walls(ctx)
    if own is None or len(own) < limits["min_steps"]:
        return False
    if not _rises(own, limits):
        return True
    host = ctx.metrics.host_steps
    onset = onset_step(host, sorted(int(r) for r in host["rank"].unique()), HOST_DEFAULTS)
    if onset is None:
        return False
    before, after = walls[walls.index < onset], walls[walls.index >= onset]
    return not any(len(part) >= limits["min_steps"] and _rises(part, limits)
                   for part in (before, after))  # fmt: skip


def _host_trend(slope: Slope, steps: int) -> Finding:
    """A rising step time that the ranks' waiting for a core explains (HST001): low, so that a
    host loaded midway does not read as a training trend."""
    return Finding(
        severity="low",
        title=f"step time grows {slope.growth:.0%} over {steps} steps with the time the ranks "
        "waited for a core: the host, not the training",
        evidence={
            "slope_s_per_step": slope.per_step,
            "growth": slope.growth,
            "steps": steps,
            "grows_in": "waiting for a core",
            "causes": ["the host (HST001)"],
        },
        advice="quiet the host (see HST001): the rise comes with the ranks waiting for a core",
    )


@rule("TRD002", "trend.memory_creep", pattern=5, thresholds=_CREEP_THRESHOLDS)
def memory_creep(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Memory grows step after step: the run is heading for an OOM the state estimate never saw.

    Symptom:
        One memory category (or the host RSS) rises almost monotonically over the steps with a
        significant Theil-Sen slope, although parameters, gradients and optimizer state are fixed.
    Likely cause:
        Tensors kept across steps with their autograd graph (a list of losses), caches that
        never evict, fragmentation accumulating in the allocator. Pattern 5, not 2: the state
        estimate stays flat while this grows until it exceeds the device; the slowdown it may
        also cause is reported by TRD001 (pattern 2), which names this creep as its cause.
    Fix:
        Keep `loss.item()` (a float), not the loss tensor; detach what is logged; clear caches;
        for fragmentation, allocator settings (expandable segments).
    Evidence:
        The field, its first and last bytes, the slope (bytes/step) with its lower bound, the
        growth over the run relative to the first record, and the ranks where it creeps.
    """
    creep = _main_creep(memory_creeps(ctx, limits))
    if creep is None:
        return []
    top, ranks = creep
    severity = "high" if top.slope.growth >= limits["high"] else "medium"
    where = "outside the six categories" if top.field == "host_rss" else "a memory category"
    return [
        Finding(
            severity=severity,
            title=f"memory creep: {top.field} ({where}) grows {top.slope.growth:.0%} over the run",
            ranks=ranks,
            evidence={
                "field": top.field,
                "first_bytes": top.first_bytes,
                "last_bytes": top.last_bytes,
                "slope_bytes_per_step": top.slope.per_step,
                "slope_lower_bytes_per_step": top.slope.lower,
                "growth": top.slope.growth,
            },
            advice="something is kept across steps: store `loss.item()`, detach logged tensors, "
            "clear caches; fragmentation -> PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        )
    ]
