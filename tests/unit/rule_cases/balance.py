"""Cases for the balance family: stragglers and busy imbalance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase


def _dp(runs: Any, busy_ms: list[float], step_ms: float = 100) -> Path:
    """DP ranks, 4 steps: each rank computes `busy_ms[rank]`, then waits in a blocking
    all-reduce until the step ends (the slowest rank waits only 5 ms)."""
    slowest = max(busy_ms)
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank, busy in enumerate(busy_ms):
        rows: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * step_ms
            end = t0 + slowest + 5
            rows += [
                runs.step(step, t0, end),
                runs.span(step, "fwd", t0, t0 + busy),
                runs.comm(step, t0 + busy, end, group_size=len(busy_ms), blocking=True),
            ]
        ranks[rank] = rows
    return runs.write(ranks, runs.manifest(world_size=len(busy_ms)))


def _late(runs: Any, delay_ms: list[float]) -> Path:
    """DP ranks, 6 steps of equal compute (40 ms); rank r starts its non-blocking all-reduce
    `delay_ms[r]` after its compute (a host stall, not compute), all finish together."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank, delay in enumerate(delay_ms):
        rows: list[dict[str, Any] | str] = []
        for step in range(6):
            t0 = step * 100
            rows += [
                runs.step(step, t0, t0 + 90),
                runs.span(step, "fwd", t0, t0 + 40),
                runs.comm(step, t0 + 40 + delay, t0 + 85, group_size=len(delay_ms)),
            ]
        ranks[rank] = rows
    return runs.write(ranks, runs.manifest(world_size=len(delay_ms)))


CASES = [
    RuleCase("BAL003", True, lambda runs: _late(runs, [0, 0.5, 12, 1]),
             "rank 2 starts every all-reduce 12 ms after the first", severity="medium", ranks=(2,)),
    RuleCase("BAL003", False, lambda runs: _late(runs, [0, 0.5, 1.5, 1]),
             "arrivals within 2 ms of each other"),
    RuleCase("BAL003", False, lambda runs: _late(runs, [0, 10, 11, 12]),
             "three of four ranks late alike: no one rank holds the group back"),
    RuleCase("BAL001", True, lambda runs: _dp(runs, [40, 80, 42, 41]),
             "rank 1 computes 2x the others, who wait for it", severity="high", ranks=(1,)),
    RuleCase("BAL001", False, lambda runs: _dp(runs, [40, 44, 42, 41]),
             "busy within 10% on every rank"),
    RuleCase("BAL001", False, lambda runs: _dp(runs, [80, 80, 40, 40]),
             "half the ranks are slow: imbalance, not one straggler"),
    RuleCase("BAL002", True, lambda runs: _dp(runs, [80, 80, 40, 40]),
             "two ranks compute 2x the other two", severity="medium", ranks=(0, 1)),
    RuleCase("BAL002", False, lambda runs: _dp(runs, [40, 80, 42, 41]),
             "one straggler: BAL001 names it"),
    RuleCase("BAL002", False, lambda runs: _dp(runs, [40, 44, 42, 41]),
             "busy within 10% on every rank"),
]  # fmt: skip
