"""A job that does not finish leaves its evidence (issue 40, item 1): the README's own loop on 3
gloo ranks, rank 2 hanging (or raising) in its forward of step 3, a 10 s process-group timeout.

While rank 2 hangs, its rank file says it is inside `fwd` of step 3 and the others' say they
wait in the same DDP all-reduce (`comm_issued`, same group and seq); each rank writes one
`stall` with its stack and a Flight Recorder dump; torchrun's SIGTERM is flushed; the survivors'
errors name the collective. A crash leaves an `exception` with the rank's frames. One launch per
failure, shared with tests/distributed/test_failures_e2e.py (tests/distributed/readme_runs.py);
a reference trainer's injected hang leaves its stall there too (`--inject hang:...`, pp).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.distributed.readme_runs import HEARTBEAT_S, JOB, RANKS, STALL_FLOOR_S, events, records
from tests.distributed.readme_runs import RANK as FAILING_RANK
from tests.distributed.readme_runs import STEP as FAILING_STEP

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def hang(readme_hang: dict[str, Any]) -> dict[str, Any]:
    """The hang, launched once per session (tests/distributed/readme_runs.py): every rank's
    records read while it hangs (once each has a stall), then the run directory and the
    output once torchrun has ended the job."""
    return readme_hang


@pytest.fixture(scope="module")
def crash(readme_failures: Any) -> dict[str, Any]:
    return readme_failures.get(["crash"])["crash"]


def last_flush(recs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The `name` events of the watchdog's last flush (its heartbeat or stall, then the open
    state: written again at every flush, the last one is the state now)."""
    marks = [i for i, r in enumerate(recs) if r.get("name") in ("heartbeat", "stall")]
    return events(recs[marks[-1] :], name) if marks else []


def test_while_it_hangs_the_rank_files_say_where_each_rank_is(hang: dict[str, Any]) -> None:
    during = hang["during"]
    assert all(events(recs, "stall") for recs in during), "no stall while the job hung"
    stuck = during[FAILING_RANK]
    (step,) = last_flush(stuck, "step_open")
    assert step["step"] == FAILING_STEP
    assert [(s["phase"], s["step"]) for s in last_flush(stuck, "span_open")] == [
        ("fwd", FAILING_STEP)
    ]
    assert not [r for r in stuck if r["kind"] == "step" and r["step"] == FAILING_STEP]
    waiting = []
    for rank in range(RANKS):
        if rank == FAILING_RANK:
            continue
        (issued,) = last_flush(during[rank], "comm_issued")
        assert issued["op"] == "all_reduce" and issued["group"] == "dp", issued
        assert issued["step"] == FAILING_STEP and issued["group_ranks"] == list(range(RANKS))
        completed = [r for r in during[rank] if r["kind"] == "comm" and r["group"] == "dp"]
        assert issued["seq"] == max(r["seq"] for r in completed) + 1  # the next, never done
        waiting.append((issued["seq"], issued["bytes"]))
    assert len(set(waiting)) == 1, waiting  # the same collective on every waiting rank
    heartbeats = events(stuck, "heartbeat")
    assert heartbeats and heartbeats[-1]["interval_s"] == HEARTBEAT_S


def test_each_rank_writes_one_stall_with_its_stack_and_a_flight_recorder_dump(
    hang: dict[str, Any],
) -> None:
    run = hang["run"]
    for rank in range(RANKS):
        (stall,) = events(records(run, rank), "stall")  # once per episode
        assert stall["step"] == FAILING_STEP
        assert stall["idle_s"] >= stall["threshold_s"] == STALL_FLOOR_S
        functions = [frame["function"] for frame in stall["stack"]]
        assert all(set(frame) == {"file", "line", "function"} for frame in stall["stack"])
        if rank == FAILING_RANK:  # where it stopped: the model's forward, in its sleep
            assert functions[-1] == "forward" and stall["stack"][-1]["file"] == str(JOB)
        else:  # inside backward, where DDP waits for the all-reduce
            assert "backward" in functions and "forward" not in functions[-3:]
        assert stall["fr_error"] is None
        dump = json.loads((run / stall["fr_file"]).read_text())
        assert stall["fr_file"] == f"flight-recorder/rank-{rank:05d}.json"
        names = {entry["profiling_name"] for entry in dump["entries"]}
        assert "gloo:all_reduce" in names and dump["version"]


def test_the_survivors_errors_name_the_collective_and_sigterm_is_flushed(
    hang: dict[str, Any],
) -> None:
    assert hang["returncode"] != 0
    assert "[diag] DDP's gradient all-reduce did not complete: all_reduce #" in hang["output"]
    run = hang["run"]
    for rank in range(RANKS):
        recs = records(run, rank)
        if rank == FAILING_RANK:  # torchrun ends it with SIGTERM, flushed before it dies
            (signal,) = events(recs, "signal")
            assert signal["signal"] == "SIGTERM" and signal["step"] == FAILING_STEP
            assert not events(recs, "exception") and not events(recs, "rank_closed")
            continue
        exceptions = events(recs, "exception")
        if exceptions:  # the gloo timeout reached the rank before torchrun's SIGTERM did
            assert "all_reduce #" in exceptions[0]["message"]
            assert exceptions[0]["fr_file"] == f"flight-recorder/rank-{rank:05d}.json"
        else:
            assert events(recs, "signal")


def test_a_crash_records_the_exception_before_the_process_dies(crash: dict[str, Any]) -> None:
    assert crash["returncode"] != 0
    recs = records(crash["run"], FAILING_RANK)
    (exception,) = events(recs, "exception")
    assert exception["step"] == FAILING_STEP and exception["type"] == "RuntimeError"
    assert exception["message"] == f"injected crash: rank {FAILING_RANK} at step {FAILING_STEP}"
    assert exception["frames"][-1]["function"] == "forward"
    assert len(exception["frames"]) <= 20
    assert not [r for r in recs if r["kind"] == "step" and r["step"] == FAILING_STEP]
