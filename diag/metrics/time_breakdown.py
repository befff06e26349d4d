"""The time breakdown: per (rank, step), wall, busy, communication in flight, exposed
communication, idle and stage work, from the spans and blocking collectives inside each step's
window; and its per-rank totals (docs/metrics.md, "Time")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag import schema
from diag.intervals import union_length_by
from diag.metrics.common import KEYS, NS_PER_S

PIPELINE_GROUP = "pp"


def _clipped(frame: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Intervals of analysed steps cut to their rank's step window (empty ones dropped);
    each record finds its (rank, step) window by one integer key, not a merge."""
    at, found = _window_rows(frame, windows)
    t0 = np.maximum(frame["t0"].to_numpy(np.int64)[found], windows["w0"].to_numpy()[at])
    t1 = np.minimum(frame["t1"].to_numpy(np.int64)[found], windows["w1"].to_numpy()[at])
    kept = t1 > t0
    return pd.DataFrame({
        "rank": frame["rank"].to_numpy(np.int64)[found][kept],
        "step": frame["step"].to_numpy(np.int64)[found][kept],
        "t0": t0[kept],
        "t1": t1[kept],
    })  # fmt: skip


def _window_rows(frame: pd.DataFrame, windows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of `frame` whose (rank, step) has a window: that window's row, and which
    rows of `frame` they are (a boolean mask)."""
    ranks, steps = frame["rank"].to_numpy(np.int64), frame["step"].to_numpy(np.int64)
    window_ranks = windows["rank"].to_numpy(np.int64)
    window_steps = windows["step"].to_numpy(np.int64)
    if not len(ranks) or not len(window_ranks):
        return np.zeros(0, dtype=np.int64), np.zeros(len(ranks), dtype=bool)
    width = int(max(steps.max(), window_steps.max())) + 1
    window_keys = window_ranks * width + window_steps
    order = np.argsort(window_keys, kind="stable")
    sorted_keys = window_keys[order]
    keys = ranks * width + steps
    position = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    found = sorted_keys[position] == keys
    return order[position[found]], found


def _blocking(comms: pd.DataFrame) -> pd.Series:
    """`blocking` where recorded; otherwise blocking unless `async` is true."""
    is_async = comms["async"].where(comms["async"].notna(), False).astype(bool)
    return comms["blocking"].where(comms["blocking"].notna(), ~is_async).astype(bool)


def time_breakdown(spans: pd.DataFrame, comms: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    windows = steps[[*KEYS, "t0", "t1"]].rename(columns={"t0": "w0", "t1": "w1"})
    compute = _clipped(spans[spans["phase"].isin(schema.COMPUTE_PHASES)], windows)
    comm_waits = _clipped(spans[spans["phase"] == schema.Phase.COMM_WAIT.value], windows)
    blocking = comms[_blocking(comms)]
    in_pipeline = (blocking["group"] == PIPELINE_GROUP).to_numpy(dtype=bool)
    pipeline_waits = _clipped(blocking[in_pipeline], windows)
    own_waits = pd.concat([comm_waits, _clipped(blocking[~in_pipeline], windows)])
    waits = pd.concat([own_waits, pipeline_waits])
    in_flight = union_length_by(_clipped(comms, windows), KEYS)
    exposed = union_length_by(waits, KEYS)
    compute_or_wait = union_length_by(pd.concat([compute, waits]), KEYS)
    stage_work = union_length_by(pd.concat([compute, own_waits]), KEYS)
    out = windows[KEYS].copy()
    out["wall_ns"] = windows["w1"] - windows["w0"]
    measures = (
        ("comm", in_flight), ("exposed", exposed), ("either", compute_or_wait),
        ("stage_work", stage_work),
    )  # fmt: skip
    for name, measure in measures:
        joined = out.join(measure.rename(name), on=KEYS)[name]
        out[name] = joined.fillna(0).astype("int64")
    busy_ns = out["either"] - out["exposed"]
    idle_ns = (out["wall_ns"] - busy_ns - out["exposed"]).clip(lower=0)
    return pd.DataFrame({
        "rank": out["rank"],
        "step": out["step"],
        "wall_s": out["wall_ns"] / NS_PER_S,
        "busy_s": busy_ns / NS_PER_S,
        "comm_s": out["comm"] / NS_PER_S,
        "exposed_comm_s": out["exposed"] / NS_PER_S,
        "idle_s": idle_ns / NS_PER_S,
        "stage_work_s": out["stage_work"] / NS_PER_S,
    })  # fmt: skip


def rank_table(rank_steps: pd.DataFrame, manifest: schema.Manifest) -> pd.DataFrame:
    hosts = {info.rank: info.host for info in manifest.ranks}
    by_rank = rank_steps.groupby("rank")
    totals = by_rank[
        ["wall_s", "busy_s", "comm_s", "exposed_comm_s", "idle_s", "stage_work_s"]
    ].sum()
    table = pd.DataFrame({
        "rank": totals.index.astype("int64"),
        "host": [hosts.get(int(r)) for r in totals.index],
        "steps": by_rank.size().to_numpy(),
        "step_time_s": by_rank["wall_s"].mean().to_numpy(),
    })  # fmt: skip
    for name in totals.columns:
        table[name] = totals[name].to_numpy()
    wall = table["wall_s"].where(table["wall_s"] > 0)
    table["busy_frac"] = table["busy_s"] / wall
    table["comm_share"] = table["comm_s"] / wall
    table["exposed_comm_share"] = table["exposed_comm_s"] / wall
    table["idle_frac"] = table["idle_s"] / wall
    return table
