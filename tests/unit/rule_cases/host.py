"""Cases for the host rule: ranks waiting for a core (the step records' run-queue wait)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rule_cases import RuleCase

MS = 1_000_000


def _run(runs: Any, ranks: int, cores: int, waiting_ms: Any, steps: int = 8) -> Path:
    """`ranks` DP ranks on one machine of `cores` usable cores, 40 ms steps: each computes
    until a blocking all-reduce; `waiting_ms(step)` of each step was spent waiting for a core
    (the training thread ran for the rest of its compute)."""
    records: dict[int, list[dict[str, Any] | str]] = {r: [] for r in range(ranks)}
    t = 0.0
    for step in range(steps):
        waited = waiting_ms(step)
        for rows in records.values():
            rows += [runs.span(step, "fwd", t, t + 30 + waited),
                     runs.comm(step, t + 30 + waited, t + 40 + waited, op="all_reduce",
                               group="dp", group_size=ranks, blocking=True),
                     runs.step(step, t, t + 40 + waited, cpu_ns=int(30 * MS),
                               runq_ns=int(waited * MS), proc_cpu_ns=int(32 * MS),
                               proc_runq_ns=int(waited * MS), nivcsw=3, load1=1.0)]  # fmt: skip
        t += 41 + waited
    manifest = runs.manifest(world_size=ranks, groups={"dp": [list(range(ranks))]})
    manifest["ranks"] = [{"rank": r, "host": "h0", "machine": "h0", "usable_cores": cores}
                         for r in range(ranks)]  # fmt: skip
    return runs.write(records, manifest)


CASES = [
    RuleCase("HST001", True, lambda runs: _run(runs, 4, 2, lambda step: 40.0),
             "4 ranks on 2 cores wait for a core half of every step", severity="high",
             ranks=(0, 1, 2, 3)),
    RuleCase("HST001", True, lambda runs: _run(runs, 2, 2, lambda step: 50.0),
             "2 ranks on 2 cores wait over half the step: other work, not the layout",
             severity="medium", ranks=(0, 1)),
    RuleCase("HST001", True, lambda runs: _run(runs, 2, 2, lambda step: 20.0),
             "2 ranks on 2 cores wait a third of the step (a CPU hog beside them)",
             severity="low", ranks=(0, 1)),
    RuleCase("HST001", False, lambda runs: _run(runs, 2, 2, lambda step: 2.0),
             "a quiet host: 2 ms of a 42 ms step waiting for a core"),
    RuleCase("HST001", False, lambda runs: _run(runs, 4, 2, lambda step: 0.0),
             "4 ranks on 2 cores that never waited (the counters, not the count, decide)"),
    RuleCase("TRD001", True, lambda runs: _run(runs, 2, 2, lambda step: 6.0 * step, steps=12),
             "a host ever more loaded: a low trend naming the host, not the training",
             severity="low"),
]  # fmt: skip
