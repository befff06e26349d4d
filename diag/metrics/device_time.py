"""Device time of profiler traces in HTA's terms (kernel time, idle, compute, communication and its
overlap), per rank, from `RunData.device_time` (diag/read/kineto/device.py measures it)."""

from __future__ import annotations

import pandas as pd

COLUMNS = ["rank", "kernel_time_s", "idle_share", "compute_share", "non_compute_share",
           "comm_s", "comm_overlap"]  # fmt: skip


def device_time(measured: pd.DataFrame | None) -> pd.DataFrame:
    """Seconds and shares of each rank's kernel time; empty for a run directory."""
    if measured is None or measured.empty:
        return pd.DataFrame(columns=COLUMNS)
    kernel_us = measured["kernel_time_us"].astype("float64").where(measured["kernel_time_us"] > 0)
    table = pd.DataFrame({
        "rank": measured["rank"].astype("int64"),
        "kernel_time_s": kernel_us / 1e6,
        "idle_share": measured["idle_us"] / kernel_us,
        "compute_share": measured["compute_us"] / kernel_us,
        "non_compute_share": measured["non_compute_us"] / kernel_us,
        "comm_s": measured["comm_us"] / 1e6,
        "comm_overlap": measured["overlap"],
    })  # fmt: skip
    return table.sort_values("rank").reset_index(drop=True)
