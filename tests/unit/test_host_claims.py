"""HST001 claims only the time the records show the host took (issue: right under noise).

The step records carry the run-queue wait of every thread of the process summed
(`proc_runq_ns`): beside a CPU hog a rank's other threads (its intra-op pool, its loader's)
queue while its training thread sleeps. That sleep is off the core but not waiting for one: a
straggler sleeping 60 ms a step must stay the straggler's time, not become the host's because
its idle threads queued meanwhile. Simulated as the collectors write it: 4 DP ranks on 2
cores, each computing CPU_MS and waiting QUEUED_MS for a core in its forward, then a blocking
all-reduce; rank 3 sleeps SLEEP_MS in its forward too, while its other threads queue
OTHERS_MS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_path, load_any
from diag.metrics import compute_metrics

MS = 1_000_000
CPU_MS, QUEUED_MS, SLEEP_MS, OTHERS_MS, STEPS = 20.0, 25.0, 60.0, 70.0, 8


def _straggler(runs: Any) -> Path:
    records: dict[int, list[dict[str, Any] | str]] = {r: [] for r in range(4)}
    t = 0.0
    for step in range(STEPS):
        end = t + CPU_MS + QUEUED_MS + SLEEP_MS + 5
        for rank, rows in records.items():
            computed = t + CPU_MS + QUEUED_MS + (SLEEP_MS if rank == 3 else 0.0)
            others = OTHERS_MS if rank == 3 else 0.0
            rows += [runs.span(step, "fwd", t, computed),
                     runs.comm(step, computed, end, op="all_reduce", group="dp", group_size=4,
                               blocking=True),
                     runs.step(step, t, end, cpu_ns=int(CPU_MS * MS), runq_ns=int(QUEUED_MS * MS),
                               proc_cpu_ns=int((CPU_MS + 2) * MS),
                               proc_runq_ns=int((QUEUED_MS + others) * MS), nivcsw=3,
                               load1=6.0)]  # fmt: skip
        t = end + 1
    manifest = runs.manifest(world_size=4, groups={"dp": [[0, 1, 2, 3]]})
    manifest["ranks"] = [{"rank": r, "host": "h0", "machine": "h0", "usable_cores": 2}
                         for r in range(4)]  # fmt: skip
    return runs.write(records, manifest, name="dp-sleeping-straggler")


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import RunWriter

    return _straggler(RunWriter(tmp_path_factory.mktemp("host-claims")))


def test_a_sleep_beside_queued_threads_is_not_waiting_for_a_core(straggler: Path) -> None:
    metrics = compute_metrics(load_any(straggler))
    waited = metrics.host_steps.groupby("rank")["descheduled_s"].mean()
    comm = metrics.rank_steps.groupby("rank")["comm_s"].mean()
    # the training thread's own wait, plus its time in the collective its threads serve
    assert waited[3] <= QUEUED_MS / 1e3 + comm[3] + 1e-6, (waited[3], comm[3])
    assert waited[3] < SLEEP_MS / 1e3, waited[3]  # 90 ms (its time off the core) before


def test_the_straggler_leads_and_the_host_claims_less_than_its_sleep(straggler: Path) -> None:
    findings = analyze_path(straggler)["findings"]
    main = findings[0]
    assert (main["rule"], main["ranks"]) == ("BAL001", [3]), [f["title"] for f in findings]
    (host,) = [f for f in findings if f["rule"] == "HST001"]
    # every rank had its cores: each step shorter by the queueing (25 ms of ~115), not by a
    # share of rank 3's sleep
    assert host["cost_s"] < main["cost_s"], (host["cost_s"], main["cost_s"])
    assert host["cost_s"] < 2 * QUEUED_MS / 1e3, host["cost_s"]
