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
