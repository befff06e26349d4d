"""Cases for the trend family (pattern 2: step time decays; memory creep)."""

from __future__ import annotations

from typing import Any

from rule_cases import RuleCase
from rule_cases._state_runs import state_run

MIB = 2**20
GROWING = [100.0 + 8 * s + (3 if s % 2 else -3) for s in range(12)]  # +8 ms a step, jittered
FLAT = [100.0 + (3 if s % 2 else -3) + (s % 3) for s in range(12)]


def _creeping(runs: Any, walls: list[float], mib_per_step: float) -> Any:
    def mem(rank: int, step: int) -> list[Any]:
        return [runs.mem(step, params=MIB, activations=10 * MIB + mib_per_step * MIB * step)]

    return state_run(runs, walls, extra=mem)


CASES = [
    RuleCase("TRD001", True, lambda runs: _creeping(runs, GROWING, 4),
             "step time +8 ms a step with activations creeping: named cause, both ranks",
             severity="high",
             ranks=(0, 1)),
    RuleCase("TRD001", False, lambda runs: _creeping(runs, FLAT, 0), "flat, jittered steps"),
    RuleCase("TRD001", False, lambda runs: state_run(runs, GROWING[:4]),
             "too few steps to judge a trend"),
    RuleCase("TRD002", True, lambda runs: _creeping(runs, FLAT, 4),
             "activations +4 MiB every step while step time stays flat",
             severity="high", ranks=(0, 1)),
    RuleCase("TRD002", False, lambda runs: _creeping(runs, FLAT, 0), "constant memory"),
    RuleCase("TRD002", False, lambda runs: state_run(runs, [100.0], ranks=1),
             "one step, one rank, no memory records"),
]  # fmt: skip
