"""Cases for the balance rules found by the replay (random imbalance, host time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase

STEP_GAP_MS = 1.0


def _synced(runs: Any, compute_ms: Any, stall_ms: Any = lambda rank, step: 0.0) -> Path:
    """2 DP ranks, 5 steps: each computes `compute_ms(rank, step)` after `stall_ms(rank, step)`
    of host time before its step starts, then a blocking 5 ms all-reduce that ends when the
    later rank has arrived; the next step starts after it."""
    ranks: dict[int, list[dict[str, Any] | str]] = {0: [], 1: []}
    t = 0.0
    for step in range(5):
        starts = {r: t + stall_ms(r, step) for r in ranks}
        arrive = {r: starts[r] + compute_ms(r, step) for r in ranks}
        end = max(arrive.values()) + 5
        for r, rows in ranks.items():
            rows += [runs.span(step, "fwd", starts[r], arrive[r]),
                     runs.comm(step, arrive[r], end, op="all_reduce", group="dp", blocking=True),
                     runs.step(step, starts[r], end)]  # fmt: skip
        t = end + STEP_GAP_MS
    manifest = runs.manifest(world_size=2, groups={"dp": [[0, 1]]})
    return runs.write(ranks, manifest)


def _alternating(rank: int, step: int) -> float:
    return 80.0 if rank == step % 2 else 40.0  # the slow rank changes every step


CASES = [
    RuleCase("BAL004", True, lambda runs: _synced(runs, _alternating),
             "the slow rank alternates: each step waits 40 ms for a different one",
             severity="medium"),
    RuleCase("BAL004", False, lambda runs: _synced(runs, lambda r, s: 40.0),
             "every rank computes 40 ms every step"),
    RuleCase("BAL005", True,
             lambda runs: _synced(runs, lambda r, s: 40.0, lambda r, s: 40.0 * r),
             "rank 1 stalls 40 ms before each step (outside it) while rank 0 waits",
             severity="medium", ranks=(1,)),
    RuleCase("BAL005", False, lambda runs: _synced(runs, lambda r, s: 40.0 + 40 * r),
             "rank 1 computes 40 ms longer: a straggler, not host time"),
]  # fmt: skip


def _one_untraced(runs: Any, late_ms: float) -> Path:
    """6 DP ranks in two groups of 3 ([0, 1, 2], [3, 4, 5]), 5 steps of 40 ms compute, a
    blocking all-reduce of the same bytes in each group (5 ms once the last member is there)
    and a small one over all 6 (1 ms); rank 5, of the second group, arrives `late_ms` later
    at its group's all-reduce and left no records."""
    ranks: dict[int, list[dict[str, Any] | str]] = {r: [] for r in range(5)}
    t = 0.0
    for step in range(5):
        group_end = {r: t + 40 + 5 + (late_ms if r >= 3 else 0.0) for r in ranks}
        end = max(group_end.values()) + 1
        for r, rows in ranks.items():
            rows += [runs.span(step, "fwd", t, t + 40),
                     runs.comm(step, t + 40, group_end[r], group="dp", group_size=3,
                               blocking=True, bytes=4_000_000),
                     runs.comm(step, group_end[r], end, group="world", group_size=6,
                               blocking=True, bytes=8),
                     runs.step(step, t, end)]  # fmt: skip
        t = end + STEP_GAP_MS
    groups = {"dp": [[0, 1, 2], [3, 4, 5]], "world": [list(range(6))]}
    return runs.write(ranks, runs.manifest(world_size=6, groups=groups))


CASES += [
    RuleCase("BAL006", True, lambda runs: _one_untraced(runs, 30.0),
             "ranks 3 and 4 wait 30 ms more in each all-reduce than the other group's members "
             "for rank 5, which left no records", severity="medium", ranks=(5,)),
    RuleCase("BAL006", False, lambda runs: _one_untraced(runs, 0.0),
             "rank 5 left no records, but its group's all-reduces take as long as the other's"),
]  # fmt: skip
