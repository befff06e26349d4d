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


def _mirrored(runs: Any, steps: int = 4) -> Path:
    """2 ranks, `steps` steps of two blocking all-reduces: rank 1 computes 80 ms more before the
    first (its straggling), rank 0 50 ms more before the second (the compute a loaded host's
    scheduler takes from it while rank 1 sleeps). Busy 180 against 150 ms: under BAL001's
    ratio, so only the replay can name rank 1; rank 0 is faster over the step."""
    before = {0: (40, 110), 1: (120, 60)}  # ms of compute before each all-reduce
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank, (first, second) in before.items():
        rows: list[dict[str, Any] | str] = []
        for step in range(steps):
            t0 = step * 240
            rows += [
                runs.step(step, t0, t0 + 235),
                runs.span(step, "fwd", t0, t0 + first),
                runs.comm(step, t0 + first, t0 + 121, blocking=True),
                runs.span(step, "bwd", t0 + 121, t0 + 121 + second),
                runs.comm(step, t0 + 121 + second, t0 + 232, blocking=True),
            ]
        ranks[rank] = rows
    return runs.write(ranks, runs.manifest(world_size=2))


def _slow_steps(runs: Any, slow_steps: set[int], steps: int = 3) -> Path:
    """4 DP ranks, `steps` steps of 90 ms (of 3, the first is warm-up): each rank computes
    10 ms, rank 1 20 ms in `slow_steps`, then a blocking all-reduce until the slowest rank's
    compute plus 5 ms, then host time until the step ends. Rank 1's excess is small against
    the step: in one step of two, removing it saves about 3% of the step."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(4):
        rows: list[dict[str, Any] | str] = []
        for step in range(steps):
            t0, slowest = step * 100, 20 if step in slow_steps else 10
            busy = slowest if rank == 1 else 10
            rows += [
                runs.step(step, t0, t0 + 90),
                runs.span(step, "fwd", t0, t0 + busy),
                runs.comm(step, t0 + busy, t0 + slowest + 5, group_size=4, blocking=True),
            ]
        ranks[rank] = rows
    return runs.write(ranks, runs.manifest(world_size=4))


def _absorbed(runs: Any, steps: int = 5) -> Path:
    """4 DP ranks, `steps` steps of 90 ms: rank 1 computes 20 ms, the others 10 ms, but rank
    2 reaches every all-reduce last, at 22 ms, after 12 ms in no record (its host's time),
    and the all-reduce ends 5 ms later. Rank 1 computes 2x its peers' time while ranks 0 and
    3 wait, but not for it: at its peers' compute, the step ends as it did."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(4):
        rows: list[dict[str, Any] | str] = []
        for step in range(steps):
            t0 = step * 100
            busy = 20 if rank == 1 else 10
            arrives = 22 if rank == 2 else busy
            rows += [
                runs.step(step, t0, t0 + 90),
                runs.span(step, "fwd", t0, t0 + busy),
                runs.comm(step, t0 + arrives, t0 + 27, group_size=4, blocking=True),
            ]
        ranks[rank] = rows
    return runs.write(ranks, runs.manifest(world_size=4))


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
    RuleCase("BAL001", True, _mirrored,
             "2 ranks: rank 1 is 80 ms slower before one collective, rank 0 50 ms before the "
             "other; only rank 1 is slower over the step", severity="medium", ranks=(1,)),
    RuleCase("BAL001", False, lambda runs: _slow_steps(runs, {2}),
             "rank 1 computes 2x in one of the two analysed steps, at 3% of the step: one "
             "slow step is what a loaded host's noise makes too"),
    RuleCase("BAL001", True, lambda runs: _slow_steps(runs, {1, 2}),
             "rank 1 computes 2x in both analysed steps", severity="medium", ranks=(1,)),
    RuleCase("BAL001", False, lambda runs: _slow_steps(runs, {0}, steps=1),
             "one step only: rank 1 computes 2x in it, at 11% of the step; one measurement "
             "shows a late rank (BAL003), not a persistently slow one"),
    RuleCase("BAL001", False, lambda runs: _mirrored(runs, steps=1),
             "the replay's straggler of the mirrored case, from one step only"),
    RuleCase("BAL001", False, _absorbed,
             "rank 1 computes 2x its peers in every step, but the all-reduce waits for rank "
             "2's host time: the replay, over every analysed step, says its compute costs "
             "nothing"),
    RuleCase("BAL002", True, lambda runs: _dp(runs, [80, 80, 40, 40]),
             "two ranks compute 2x the other two", severity="medium", ranks=(0, 1)),
    RuleCase("BAL002", False, lambda runs: _dp(runs, [40, 80, 42, 41]),
             "one straggler: BAL001 names it"),
    RuleCase("BAL002", False, lambda runs: _dp(runs, [40, 44, 42, 41]),
             "busy within 10% on every rank"),
]  # fmt: skip
