"""A real gloo job for the failure tests (tests/distributed/test_flight_recorder.py): RANKS ranks
all-reduce a tensor each step; in step FAIL_STEP rank 1 either skips it (`hang`: it sleeps in
its "loader" instead) or passes a smaller tensor (`desync`); `healthy` runs every step. Each rank
writes its records as the collectors do by the contract (docs/run-format.md; CONTRACT-40:
completed records with `seq`, `comm_issued` before a collective, `span_open`, heartbeats,
`exception`, `rank_closed`) and, when it stops, PyTorch's Flight Recorder JSON dump in
RUN/flight-recorder/rank-NNNNN.json (TORCH_FR_BUFFER_SIZE set before torch starts).

    python fr_job.py RUN MODE RANKS
    python fr_job.py ROOT hang,desync,healthy RANKS   # each job in ROOT/MODE, all at once

The ranks are forked from the launcher once it has imported torch (each still its own process,
with its own process group).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time

STEPS = 4
FAIL_STEP = 2
TIMEOUT_S = 8.0
"""The steps' group timeout: short, so the survivors of a hang fail fast, yet long enough that
a rank the loaded machine keeps off a core for seconds is not read as a timeout (at 3 s a CI
run's desync job saw rank 0 time out before rank 1 reached its broadcast)."""


class Records:
    """One rank's JSON-lines rank file, flushed at every write (a test-sized recorder)."""

    def __init__(self, run: str, rank: int) -> None:
        self.handle = open(os.path.join(run, f"rank-{rank:05d}.jsonl"), "a")  # noqa: SIM115
        self.lock = threading.Lock()

    def write(self, **record: object) -> None:
        with self.lock:
            self.handle.write(json.dumps(record) + "\n")
            self.handle.flush()

    def event(self, step: int, name: str, **fields: object) -> None:
        self.write(kind="event", step=step, name=name, **fields)


def heartbeat(records: Records, state: dict, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        records.event(state["step"], "heartbeat", t_ns=time.time_ns(), interval_s=0.5)


def dump_fr(run: str, rank: int) -> None:
    import torch

    folder = os.path.join(run, "flight-recorder")
    os.makedirs(folder, exist_ok=True)
    text = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
    with open(os.path.join(folder, f"rank-{rank:05d}.json"), "w") as handle:
        handle.write(text if isinstance(text, str) else text.decode())
    pickled = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
    with open(os.path.join(run, f"fr-rank-{rank}.pkl"), "wb") as handle:
        handle.write(pickled)


def main(run: str, mode: str, rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    # a long timeout while the ranks start (torch imports slowly on a loaded machine), a short
    # one on the group the steps use: the survivors of a hang fail fast
    dist.init_process_group(
        "gloo",
        init_method=f"file://{run}/.store",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    group = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=TIMEOUT_S))
    records = Records(run, rank)
    state = {"step": 0}
    stop = threading.Event()
    threading.Thread(target=heartbeat, args=(records, state, stop), daemon=True).start()
    grads = torch.ones(1000)
    seq = 0
    try:
        for step in range(STEPS):
            state["step"] = step
            t0 = time.time_ns()
            records.event(step, "step_open", t0=t0)
            records.event(step, "span_open", phase="fwd", mb=0, stage=None, chunk=None, t0=t0)
            if mode == "hang" and rank == 1 and step == FAIL_STEP:
                time.sleep(TIMEOUT_S + 2.5)  # stuck in its loader: never joins the all-reduce
                break
            time.sleep(0.02)
            t1 = time.time_ns()
            records.write(kind="span", step=step, mb=0, phase="fwd", t0=t0, t1=t1)
            tensor, op = grads, "all_reduce"
            if mode == "desync" and rank == 1 and step == FAIL_STEP:
                op = "broadcast"  # a branch only this rank takes: another collective
            seq += 1
            issued = {
                "op": op,
                "group": "world",
                "group_size": world,
                "seq": seq,
                "bytes": tensor.numel() * 4,
                "dtype": "float32",
                "t0": t1,
                "group_ranks": list(range(world)),
            }
            records.event(step, "comm_issued", **issued)
            if op == "broadcast":
                dist.broadcast(tensor, src=1, group=group)
            else:
                dist.all_reduce(tensor, group=group)
            t2 = time.time_ns()
            records.write(
                kind="comm",
                step=step,
                t0=t1,
                t1=t2,
                **{k: v for k, v in issued.items() if k != "t0"},
            )
            records.write(kind="step", step=step, t0=t0, t1=t2, tokens=8, loss=1.0)
        else:
            records.event(STEPS - 1, "rank_closed", t_ns=time.time_ns(), status="complete")
    except RuntimeError as err:  # the process group's timeout: what the survivors see
        records.event(
            state["step"],
            "exception",
            t_ns=time.time_ns(),
            type="RuntimeError",
            message=str(err)[:2000],
            frames=[{"file": __file__, "line": 0, "function": "main"}],
        )
        records.event(state["step"], "rank_closed", t_ns=time.time_ns(), status="failed")
    stop.set()
    dump_fr(run, rank)
    os._exit(0)  # no teardown: a peer may be gone


def start(run: str, mode: str, ranks: int) -> list[int]:
    """The job of `mode`: its manifest, then its ranks forked from this process (torch is
    imported once, here, not in every rank: the import is most of a small job's time)."""
    os.makedirs(run, exist_ok=True)
    manifest = {"schema": "diag.run/1", "run_id": f"fr-{mode}",
                "created": "2026-12-06T00:00:00Z", "trainer": "custom",
                "world_size": ranks, "backend": "gloo", "device_type": "cpu",
                "layout": {"dp": ranks}, "groups": {"world": [list(range(ranks))]},
                "status": "running"}  # fmt: skip
    with open(os.path.join(run, "manifest.json"), "w") as handle:
        json.dump(manifest, handle)
    pids = []
    for rank in range(ranks):
        pid = os.fork()
        if pid == 0:  # the rank: it ends with os._exit, never returns here
            try:
                main(run, mode, rank, ranks)
            finally:
                os._exit(1)
        pids.append(pid)
    return pids


def wait(pids: list[int], deadline: float) -> int:
    """The ranks' worst exit code once all have ended; 1 (and the rest killed) at `deadline`."""
    codes: dict[int, int] = {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, 9)
            return 1
        time.sleep(0.05)
    return max(codes.values())


if __name__ == "__main__":
    os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    target, modes, world = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    import torch  # noqa: F401  (before the forks: every rank inherits it)

    limit = time.monotonic() + 100
    if len(modes) == 1:  # fr_job.py RUN MODE RANKS
        sys.exit(wait(start(target, modes[0], world), limit))
    # fr_job.py ROOT MODE,MODE,... RANKS: the jobs side by side, in ROOT/MODE. Their ranks
    # mostly wait (a hang's sleep, the survivors' timeout): at once, the jobs take the
    # longest one's time, not the sum, and a rank has no import left to be starved in.
    pids = [pid for m in modes for pid in start(os.path.join(target, m), m, world)]
    sys.exit(wait(pids, limit))
