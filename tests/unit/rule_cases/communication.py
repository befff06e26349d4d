"""Cases for the communication family."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase


def _dp2(runs: Any, comm_ms: float) -> Path:
    """2 DP ranks, 4 steps of 100 ms: compute, then `comm_ms` of blocking all-reduce."""
    ranks: dict[int, list[dict[str, Any] | str]] = {}
    for rank in range(2):
        records: list[dict[str, Any] | str] = []
        for step in range(4):
            t0 = step * 100.0
            records.append(runs.step(step, t0, t0 + 100))
            records.append(runs.span(step, "fwd", t0, t0 + 100 - comm_ms))
            records.append(
                runs.comm(
                    step,
                    t0 + 100 - comm_ms,
                    t0 + 100,
                    op="all_reduce",
                    group="dp",
                    group_size=2,
                    bytes=1000,
                    blocking=True,
                )
            )
        ranks[rank] = records
    return runs.write(ranks, runs.manifest(world_size=2))


CASES = [
    RuleCase("COM001", True, lambda runs: _dp2(runs, 60), "60% of each step is blocking comm"),
    RuleCase("COM001", False, lambda runs: _dp2(runs, 5), "5% of each step is blocking comm"),
]
