"""Cases for the failure rules: runs that did not finish, written as the collectors write them
(CONTRACT-40: in-flight `span_open` / `comm_issued` / `step_open` events, heartbeats, `stall`,
`exception`, `rank_closed`), and runs that did (quiet). `failure_run` is shared with
tests/unit/test_failure.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rule_cases import RuleCase

MS = 1_000_000
BASE_NS = 1_700_000_000_000_000_000
STEP_MS = 100.0
GOOD_STEPS = 6
"""Steps 0-5 complete on every rank; the failure (if any) is in step 6, collective #7 of dp."""
BYTES = 4096
WAIT_MS = 20_000.0
"""How long the survivors sit in the stuck collective (their heartbeats say so)."""
HEARTBEAT_MS = 2_000.0
STACK = [{"file": "train.py", "line": 40, "function": "main"},
         {"file": "loader.py", "line": 12, "function": "next_batch"}]  # fmt: skip


def run_ns(ms: float) -> int:
    """ms on the run's clock, in ns."""
    return BASE_NS + int(ms * MS)


def _event(step: int, name: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "event", "step": step, "name": name, **fields}


def _good_steps(
    runs: Any, ranks: int, heartbeats: bool = True
) -> dict[int, list[dict[str, Any] | str]]:
    records: dict[int, list[dict[str, Any] | str]] = {r: [] for r in range(ranks)}
    for step in range(GOOD_STEPS):
        t = step * STEP_MS
        for rows in records.values():
            rows += [runs.span(step, "fwd", t, t + 40), runs.span(step, "bwd", t + 40, t + 80),
                     runs.comm(step, t + 80, t + 90, group_size=ranks, bytes=BYTES,
                               dtype="float32", seq=step + 1),
                     runs.span(step, "opt", t + 90, t + 99),
                     runs.step(step, t, t + 99)]  # fmt: skip
            if heartbeats:
                rows.append(_event(step, "heartbeat", t_ns=run_ns(t + 50), interval_s=2.0))
    return records


def _waiting(runs: Any, step: int, ranks: int, **issued: Any) -> list[dict[str, Any] | str]:
    """A rank that ran step 6's fwd and bwd and sits in all-reduce #7 of dp, heartbeating."""
    t = step * STEP_MS
    fields = {"op": "all_reduce", "group": "dp", "group_size": ranks, "seq": step + 1,
              "bytes": BYTES, "dtype": "float32", "t0": run_ns(t + 80), **issued}  # fmt: skip
    rows: list[dict[str, Any] | str] = [
        runs.span(step, "fwd", t, t + 40), runs.span(step, "bwd", t + 40, t + 80),
        _event(step, "step_open", t0=run_ns(t)), _event(step, "comm_issued", **fields),
    ]  # fmt: skip
    beats = int(WAIT_MS // HEARTBEAT_MS)
    rows += [_event(step, "heartbeat", t_ns=run_ns(t + 80 + k * HEARTBEAT_MS), interval_s=2.0)
             for k in range(1, beats + 1)]  # fmt: skip
    return rows


TIMEOUT_MS = 3_000.0
"""The group timeout of the `timeout-*` runs: below the window (3 median steps + 5 s)."""


def _timed_out(runs: Any, step: int, ranks: int) -> list[dict[str, Any] | str]:
    """A rank whose all-reduce #7 of dp raised the group's timeout after TIMEOUT_MS."""
    t = step * STEP_MS
    rows = _waiting(runs, step, ranks)[:4]
    end = t + 80 + TIMEOUT_MS
    rows += [_event(step, "heartbeat", t_ns=run_ns(t + 80 + HEARTBEAT_MS), interval_s=2.0),
             _event(step, "exception", t_ns=run_ns(end), type="RuntimeError",
                    message="[Rank 0] Timed out waiting 3000ms for recv operation to complete",
                    frames=STACK[:1]),
             _event(step, "rank_closed", t_ns=run_ns(end + 1), status="failed")]  # fmt: skip
    return rows


def _bare(runs: Any, step: int) -> list[dict[str, Any] | str]:
    """A rank of records without in-flight state: fwd and bwd of `step`, then the exception
    its collective's timeout raised 3 s later, and its close."""
    t = step * STEP_MS
    end = run_ns(t + 80 + TIMEOUT_MS)
    return [runs.span(step, "fwd", t, t + 40), runs.span(step, "bwd", t + 40, t + 80),
            _event(step, "exception", t_ns=end, type="RuntimeError",
                   message="Timed out waiting 3000ms for recv operation to complete",
                   frames=STACK[:1]),
            _event(step, "rank_closed", t_ns=end + MS, status="failed")]  # fmt: skip


def _raised_in_collective(runs: Any, step: int, ranks: int) -> list[dict[str, Any] | str]:
    """A rank whose all-reduce #7 of dp raised an NCCL error 5 ms after it issued it."""
    raised = run_ns(step * STEP_MS + 85)
    return [*_waiting(runs, step, ranks)[:4],
            _event(step, "exception", t_ns=raised, type="DistBackendError",
                   message="NCCL error: unhandled cuda error", frames=STACK[:1]),
            _event(step, "rank_closed", t_ns=raised + MS, status="failed")]  # fmt: skip


def _reset_in_collective(
    runs: Any, step: int, ranks: int, raised_ms: float
) -> list[dict[str, Any] | str]:
    """A survivor's records when its peer died in all-reduce #7: it waits there until the
    connection resets `raised_ms` into the run, then raises (what follows is the caller's)."""
    return [*_waiting(runs, step, ranks)[:4],
            _event(step, "exception", t_ns=run_ns(raised_ms), type="RuntimeError",
                   message="Read error: Connection reset by peer", frames=STACK[:1])]  # fmt: skip


def _late_rank(runs: Any, step: int, kind: str) -> list[dict[str, Any] | str]:
    """Rank 2 of a `timeout-*` run: in its loader until after the others timed out, then (a
    desync) a broadcast as #7 of dp; alive (heartbeats) to the end of the records."""
    t = step * STEP_MS
    rows: list[dict[str, Any] | str] = [
        _event(step, "step_open", t0=run_ns(t)),
        _event(step, "span_open", phase="fwd", mb=0, stage=None, chunk=None, t0=run_ns(t)),
    ]  # fmt: skip
    late = t + 80 + TIMEOUT_MS + 1_000
    if kind == "timeout-desync":
        rows += [runs.span(step, "fwd", t, late - 1),
                 _event(step, "comm_issued", op="broadcast", group="dp", group_size=4,
                        seq=step + 1, bytes=BYTES, dtype="float32", t0=run_ns(late))]  # fmt: skip
    rows += [_event(step, "heartbeat", t_ns=run_ns(t + k * HEARTBEAT_MS), interval_s=2.0)
             for k in range(1, 4)]  # fmt: skip
    return rows


ENDED_S = 3600.0
"""How long ago a run that ended wrote its files (no record arrives any more)."""


def failure_run(
    runs: Any, kind: str, ranks: int = 4, name: str = "run", ended: bool | None = None
) -> Path:
    """4 DP ranks, steps 0-5 complete; in step 6 rank 2 does `kind`:
    - `hang`: sleeps in its data loader before fwd (alive: heartbeats, a stall event);
    - `crash`: raises in fwd (exception event, rank_closed failed);
    - `desync`: issues all-reduce #7 of dp with half the bytes;
    - `lost`: its records stop inside fwd, nothing after (SIGKILL);
    - `undecidable`: every rank stops after step 5 with nothing open and no close;
    - `completed`: no failure, every rank closes complete;
    - `late`: every rank inside all-reduce #7 for 1 s (below the window): still ordinary;
    - `aborted`: its records stop inside fwd (it aborted); 2 s later the launcher ends the job:
      the others, in all-reduce #7, record SIGTERM (files fresh);
    - `aborted-early`: a job that dies in its first second, no heartbeat on disk yet (a loaded
      host delays the first): rank 2's records stop after step 5 (it aborted between two
      flushes); the others' all-reduce #7 raises 300 ms in (the peer reset the connection),
      then the launcher ends them (SIGTERM records; files fresh);
    - `aborted-early-cut`: `aborted-early`, and rank 0's last flush cut short: its records
      stop in all-reduce #7 (a heartbeat 200 ms in), no exception, no SIGTERM record;
    - `aborted-early-dumped`: `aborted-early`, and rank 0's records stop after step 5 as rank
      2's do, but rank 0 lived to dump its Flight Recorder (all-reduce #7 open in it);
    - `hang-behind`: `hang`, and rank 0 a step behind (its step 6 backward ends 0.5 s after the
      others began to wait) when the job ends;
    - `timeout-hang`: sleeps in its loader; the others' group timeout (3 s, below the window)
      ends them in all-reduce #7 with an exception, read just after (files fresh);
    - `timeout-crash`: raises inside all-reduce #7 (an NCCL error), the others time out in it
      3 s later (files fresh);
    - `timeout-bare`: records without in-flight state (no `comm_issued`, no heartbeats): rank 2
      stops before step 6's forward, the others record fwd and bwd, then raise 3 s later;
    - `timeout-desync`: kept off a core, it issues a broadcast as #7 of dp only after the
      others timed out in their all-reduce #7 (files fresh);
    - `killed-fr`: killed after step 5 (its records stop, nothing after); the others' all-reduce
      #7 raises 20 ms in (the peer reset the connection), no launcher's signal; each of them
      dumps its Flight Recorder, whose entries carry the group's 10 s timeout (files fresh);
    - `timeout-hang-fr`: `timeout-hang`, with the others' dumps carrying the 3 s timeout they
      raised at.
    The others (and rank 2 in `desync`) sit in all-reduce #7 of dp for 20 s. `ended`: the
    files dated an hour ago (records no longer arrive); by default every kind but `late`."""
    records = _good_steps(runs, ranks, heartbeats=not kind.startswith("aborted-early"))
    step, t = GOOD_STEPS, GOOD_STEPS * STEP_MS
    end = run_ns(t + 80 + WAIT_MS)
    for rank, rows in records.items():
        if kind in ("completed", "undecidable"):
            if kind == "completed":
                rows.append(_event(step - 1, "rank_closed", t_ns=run_ns(t), status="complete"))
            continue
        if kind == "late":
            rows += _waiting(runs, step, ranks)[:4]
            rows.append(_event(step, "heartbeat", t_ns=run_ns(t + 1080), interval_s=2.0))
            continue
        if kind == "aborted-early-cut" and rank == 0:
            rows += [
                *_waiting(runs, step, ranks)[:4],
                _event(step, "heartbeat", t_ns=run_ns(t + 80 + 200), interval_s=0.5),
            ]
            continue
        if kind == "aborted-early-dumped" and rank == 0:
            continue  # its records stop after step 5; its dump (below) outlives them
        if kind.startswith("aborted-early"):
            if rank != 2:
                raised = t + 80 + 300
                rows += _reset_in_collective(runs, step, ranks, raised)
                rows.append(_event(step, "signal", t_ns=run_ns(raised + 20), signal="SIGTERM"))
            continue
        if kind == "aborted":
            if rank != 2:
                rows += _waiting(runs, step, ranks)[:4]
                rows.append(_event(step, "signal", t_ns=run_ns(t + 2_080), signal="SIGTERM"))
            else:
                rows += [_event(step, "step_open", t0=run_ns(t)),
                         _event(step, "span_open", phase="fwd", mb=0, stage=None, chunk=None,
                                t0=run_ns(t))]  # fmt: skip
            continue
        if kind == "killed-fr":
            if rank != 2:
                raised = t + 80 + 20
                rows += _reset_in_collective(runs, step, ranks, raised)
                rows.append(_event(step, "rank_closed", t_ns=run_ns(raised + 1), status="failed"))
            continue
        if kind.startswith("timeout"):
            if kind == "timeout-bare":
                rows += _bare(runs, step) if rank != 2 else []
            elif rank != 2:
                rows += _timed_out(runs, step, ranks)
            elif kind == "timeout-crash":
                rows += _raised_in_collective(runs, step, ranks)
            else:
                rows += _late_rank(runs, step, kind)
            continue
        if rank == 0 and kind == "hang-behind":
            rows += [runs.span(step, "fwd", t, t + 300), runs.span(step, "bwd", t + 300, t + 580),
                     _event(step, "heartbeat", t_ns=end, interval_s=2.0)]  # fmt: skip
            continue
        if rank != 2:
            rows += _waiting(runs, step, ranks)
            continue
        if kind == "desync":
            rows += _waiting(runs, step, ranks, bytes=BYTES // 2)
            continue
        rows += [_event(step, "step_open", t0=run_ns(t)),
                 _event(step, "span_open", phase="fwd", mb=0, stage=None, chunk=None,
                        t0=run_ns(t))]  # fmt: skip
        if kind in ("hang", "hang-behind"):
            rows += [_event(step, "stall", t_ns=run_ns(t + 5_000), idle_s=5.0, threshold_s=5.0,
                            stack=STACK, fr_file=None, fr_error="gloo: no dump"),
                     _event(step, "heartbeat", t_ns=end, interval_s=2.0)]  # fmt: skip
        elif kind == "crash":
            rows += [_event(step, "exception", t_ns=run_ns(t + 10), type="RuntimeError",
                            message="CUDA error: an illegal memory access was encountered",
                            frames=STACK),
                     _event(step, "rank_closed", t_ns=run_ns(t + 11), status="failed")]  # fmt: skip
    status = "complete" if kind == "completed" else "running"
    manifest = runs.manifest(world_size=ranks, groups={"dp": [list(range(ranks))]}, status=status)
    path = runs.write(records, manifest, name=name)
    if kind == "aborted-early-dumped":
        _dump(path / "flight-recorder" / "rank-00000.json", ranks, step + 1)
    if kind in ("killed-fr", "timeout-hang-fr"):
        timeout_ms = 10_000 if kind == "killed-fr" else int(TIMEOUT_MS)
        for rank in range(ranks):
            if rank != 2:
                dump = path / "flight-recorder" / f"rank-{rank:05d}.json"
                _dump(dump, ranks, step + 1, timeout_ms=timeout_ms)
    fresh = kind in ("late", "aborted", "killed-fr") or kind.startswith(
        ("timeout", "aborted-early")
    )
    if ended if ended is not None else not fresh:
        past = time.time() - ENDED_S
        for file in path.iterdir():
            os.utime(file, (past, past))
    return path


def _dump(file: Path, ranks: int, open_seq: int, timeout_ms: int | None = None) -> None:
    """A Flight Recorder dump in torch's JSON shape: collectives 1 .. open_seq - 1 of the world
    group retired, `open_seq` scheduled; each entry with the group's `timeout_ms` if given."""
    entries = [
        {"process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
         "is_p2p": False, "profiling_name": "gloo:all_reduce", "input_sizes": [[BYTES // 4]],
         "input_dtypes": ["Float"], "retired": seq < open_seq,
         "state": "completed" if seq < open_seq else "scheduled",
         "time_created_ns": run_ns(seq * STEP_MS),
         **({"timeout_ms": timeout_ms} if timeout_ms is not None else {})}
        for seq in range(1, open_seq + 1)
    ]  # fmt: skip
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(ranks)))}}
    file.parent.mkdir(exist_ok=True)
    file.write_text(json.dumps({"version": "2.10", "pg_config": config, "entries": entries}))


CASES = [
    RuleCase("FLR001", True, lambda runs: failure_run(runs, "hang"),
             "rank 2 sleeps in its loader; 0, 1, 3 wait 20 s in all-reduce #7 of dp",
             ranks=(2,), severity="high"),
    RuleCase("FLR001", False, lambda runs: failure_run(runs, "completed"),
             "a completed run: every rank closed"),
    RuleCase("FLR001", False, lambda runs: failure_run(runs, "late"),
             "every rank inside one all-reduce for 1 s: below the window, not a hang"),
    RuleCase("FLR002", True, lambda runs: failure_run(runs, "crash"),
             "rank 2 raised in fwd of step 6; the others wait", ranks=(2,), severity="high"),
    RuleCase("FLR002", False, lambda runs: failure_run(runs, "hang"),
             "a hang raises no exception"),
    RuleCase("FLR003", True, lambda runs: failure_run(runs, "desync"),
             "rank 2 issued all-reduce #7 with half the bytes", ranks=(2,), severity="high"),
    RuleCase("FLR003", False, lambda runs: failure_run(runs, "hang"),
             "a missing rank is a hang, not a mismatch"),
    RuleCase("FLR004", True, lambda runs: failure_run(runs, "lost"),
             "rank 2's records stop in fwd; the others heartbeat 20 s more", ranks=(2,),
             severity="high"),
    RuleCase("FLR004", False, lambda runs: failure_run(runs, "hang"),
             "a hung rank still heartbeats: not lost"),
    RuleCase("FLR005", True, lambda runs: failure_run(runs, "undecidable"),
             "every rank stops after step 5, nothing open, no close", severity="medium"),
    RuleCase("FLR005", False, lambda runs: failure_run(runs, "completed"),
             "a completed run is decided"),
]  # fmt: skip
