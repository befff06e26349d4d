"""What the host did to each rank: the time it was runnable but not running (waiting for a
core), per step and per machine (docs/metrics.md, "Host").

A step's wall time is the rank's work, its waiting for peers and devices, and its waiting for
a core. Only the last is the host's: the step records carry the threads' run-queue wait
(`proc_runq_ns`, every thread of the process; `runq_ns`, the training thread alone in older
runs), bounded here by the step's time off the training thread's CPU (a thread queued while the
training thread computes delays nothing the step waits for). Runs without these fields (trace
folders, older runs) get no host table: the host could not be checked.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.contract import schema

NS_PER_S = 1e9
HOST_STEP_COLUMNS = [
    "rank",
    "step",
    "wall_s",
    "cpu_s",
    "proc_cpu_s",
    "descheduled_s",
    "thread_queued_s",
    "load1",
]


def host_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Per analysed (rank, step): wall_s, cpu_s (training thread), proc_cpu_s (every thread),
    descheduled_s (waiting for a core, NaN where not recorded), thread_queued_s (the training
    thread's own run-queue wait: what delays its compute spans), load1. Empty without any
    recorded host field."""
    if steps.empty or not any(name in steps for name in ("runq_ns", "proc_runq_ns", "cpu_ns")):
        return pd.DataFrame(columns=HOST_STEP_COLUMNS)
    wall = (steps["t1"] - steps["t0"]).to_numpy(dtype=np.float64) / NS_PER_S
    cpu = _seconds(steps, "cpu_ns")
    waited = _seconds(steps, "proc_runq_ns")
    waited = np.where(np.isnan(waited), _seconds(steps, "runq_ns"), waited)
    off_cpu = np.clip(wall - np.nan_to_num(cpu), 0.0, None)
    table = pd.DataFrame({
        "rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(), "wall_s": wall,
        "cpu_s": cpu, "proc_cpu_s": _seconds(steps, "proc_cpu_ns"),
        "descheduled_s": np.minimum(waited, off_cpu),
        "thread_queued_s": np.minimum(_seconds(steps, "runq_ns"), off_cpu),
        "load1": steps["load1"].to_numpy(dtype=np.float64) if "load1" in steps else np.nan,
    }, copy=False)  # fmt: skip
    if table["descheduled_s"].isna().all() and table["cpu_s"].isna().all():
        return pd.DataFrame(columns=HOST_STEP_COLUMNS)
    return table


def _seconds(steps: pd.DataFrame, name: str) -> np.ndarray:
    if name not in steps:
        return np.full(len(steps), np.nan)
    return steps[name].to_numpy(dtype=np.float64) / NS_PER_S


def machines(manifest: schema.Manifest) -> dict[int, str]:
    """Each rank's real machine (the manifest's `machine`, else its host, else its own)."""
    out = {}
    for info in manifest.ranks:
        out[info.rank] = info.machine or info.host or f"rank {info.rank}"
    return out


def host_table(steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    """Per machine: its ranks, the cores they may use, whether they outnumber them, the share
    of their step time spent waiting for a core, and the cores their threads kept busy."""
    columns = ["machine", "ranks", "usable_cores", "oversubscribed", "descheduled_share",
               "descheduled_per_step_s", "cores_busy"]  # fmt: skip
    if steps.empty or steps["descheduled_s"].isna().all():
        return pd.DataFrame(columns=columns)
    machine_of = machines(manifest)
    cores_of = {info.rank: info.usable_cores for info in manifest.ranks}
    frame = steps.assign(machine=steps["rank"].map(lambda r: machine_of.get(int(r), f"rank {r}")))
    rows = []
    for machine, part in frame.groupby("machine", sort=True):
        ranks = sorted(int(r) for r in part["rank"].unique())
        known = [cores_of[r] for r in ranks if cores_of.get(r)]
        cores = min(known) if known else None  # type: ignore[type-var]
        recorded = part.dropna(subset=["descheduled_s"])
        busy = part.dropna(subset=["proc_cpu_s"])
        cores_busy = (
            float(busy["proc_cpu_s"].sum() / busy.groupby("step")["wall_s"].max().sum())
            if len(busy) and busy["wall_s"].sum() > 0 else None
        )  # fmt: skip
        rows.append({
            "machine": machine, "ranks": ranks, "usable_cores": cores,
            "oversubscribed": bool(cores is not None and len(ranks) > cores),
            "descheduled_share": waiting_share(part) or 0.0,
            "descheduled_per_step_s": float(recorded.groupby("rank")["descheduled_s"].mean()
                                            .mean()) if len(recorded) else 0.0,
            "cores_busy": cores_busy,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def waiting_share(steps: pd.DataFrame) -> float | None:
    """The share of these rank-steps' wall time spent waiting for a core, over those that
    recorded it; None where none did."""
    recorded = steps.dropna(subset=["descheduled_s"])
    wall = float(recorded["wall_s"].sum())
    return float(recorded["descheduled_s"].sum()) / wall if wall > 0 else None


def descheduled_by_rank(steps: pd.DataFrame) -> pd.Series:
    """Per rank, the share of its step time it waited for a core (absent where not recorded)."""
    recorded = steps.dropna(subset=["descheduled_s"])
    if recorded.empty:
        return pd.Series(dtype=np.float64)
    by_rank = recorded.groupby("rank")
    return by_rank["descheduled_s"].sum() / by_rank["wall_s"].sum().where(lambda s: s > 0)


def busy_net_of_queueing(rank_steps: pd.DataFrame, on_host: pd.DataFrame) -> pd.DataFrame:
    """`rank_steps` with each (rank, step)'s busy_s less the training thread's time waiting
    for a core in that step, but never below the thread's CPU time in the step (capped at the
    busy time); unchanged where not recorded.

    On a loaded or oversubscribed host which rank the scheduler delays is chance: a rank
    queued 30 ms in a step computes 30 ms "longer" without doing more work. What is left is
    the rank's own compute (and its device's), which is what a straggler is judged on. The
    queueing is counted per step, not per span: the floor keeps a thread that queued after
    waking from a collective from losing compute it did."""
    if rank_steps.empty or on_host.empty or on_host["thread_queued_s"].isna().all():
        return rank_steps
    per_step = on_host.set_index(["rank", "step"])[["thread_queued_s", "cpu_s"]]
    per_step = per_step[~per_step.index.duplicated()]
    keys = pd.MultiIndex.from_arrays([rank_steps["rank"], rank_steps["step"]])
    aligned = per_step.reindex(keys)
    queued = np.nan_to_num(aligned["thread_queued_s"].to_numpy(dtype=np.float64))
    cpu = np.nan_to_num(aligned["cpu_s"].to_numpy(dtype=np.float64))
    busy = rank_steps["busy_s"].to_numpy(dtype=np.float64)
    own = np.maximum(busy - np.clip(queued, 0.0, None), np.minimum(busy, cpu))
    return rank_steps.assign(busy_s=np.clip(own, 0.0, busy))
