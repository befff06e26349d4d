"""Cases for the host rules: ranks waiting for a core (the step records' run-queue wait). GPUs
waiting for their host to launch work: rule_cases/gpu_starved.py."""

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


def _one_rank_delayed(runs: Any, queued: bool, steps: int = 8) -> Path:
    """4 DP ranks on a 4-core machine; rank 2's compute takes 25 ms longer in every step and
    the others wait for it in the all-reduce. `queued`: those 25 ms are the training thread's
    run-queue wait (the scheduler delayed it); else they are the rank's own (its device, a
    sleep: no CPU, no queueing)."""
    records: dict[int, list[dict[str, Any] | str]] = {r: [] for r in range(4)}
    t = 0.0
    for step in range(steps):
        for rank, rows in records.items():
            compute = 55.0 if rank == 2 else 30.0
            waited = 25.0 if queued and rank == 2 else 0.0
            rows += [runs.span(step, "fwd", t, t + compute),
                     runs.comm(step, t + compute, t + 65, op="all_reduce", group="dp",
                               group_size=4, blocking=True),
                     runs.step(step, t, t + 65, cpu_ns=int(30 * MS), runq_ns=int(waited * MS),
                               proc_cpu_ns=int(32 * MS), proc_runq_ns=int(waited * MS),
                               nivcsw=3, load1=1.0)]  # fmt: skip
        t += 66
    manifest = runs.manifest(world_size=4, groups={"dp": [[0, 1, 2, 3]]})
    manifest["ranks"] = [{"rank": r, "host": "h0", "machine": "h0", "usable_cores": 4}
                         for r in range(4)]  # fmt: skip
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
    RuleCase("BAL001", False, lambda runs: _one_rank_delayed(runs, queued=True),
             "a rank 'computes' 25 ms longer that it spent waiting for a core: the host's"),
    RuleCase("BAL002", False, lambda runs: _one_rank_delayed(runs, queued=True),
             "nor uneven busy time: the scheduler's choice of rank is chance"),
    RuleCase("BAL001", True, lambda runs: _one_rank_delayed(runs, queued=False),
             "the same 25 ms on the rank's own (no queueing): a straggler", severity="high",
             ranks=(2,)),
]  # fmt: skip
