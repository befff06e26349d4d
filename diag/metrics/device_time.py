"""Device time of profiler traces in HTA's terms (kernel time, idle, compute, communication and its
overlap), per rank, from `RunData.device_time` (diag/read/kineto/device.py measures it); and
what the idle time waited for, with what the CPU did meanwhile (diag/read/kineto/idle.py,
host_calls.py): the evidence of a GPU starved by its host (HST002)."""

from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["rank", "kernel_time_s", "idle_share", "compute_share", "non_compute_share",
           "comm_s", "comm_overlap",
           # HTA's idle time breakdown: shares of the idle summed over streams
           "host_wait_share", "kernel_wait_share", "other_idle_share",
           # the device's own idle (every stream together) the host caused, and per step
           "device_host_wait_share", "steps", "step_s", "host_wait_per_step_s",
           "host_gaps_per_step",
           # the device's own idle with its next kernel already launched (a dependency)
           "device_queued_wait_share", "queued_wait_per_step_s", "longest_queued_gap_s",
           # what the CPU did over the same steps
           "kernels_per_step", "kernel_median_us", "launch_mean_us", "launch_per_step_s",
           "sync_calls_per_step", "scalar_reads_per_step", "sync_per_step_s",
           "loader_per_step_s", "graph_launches"]  # fmt: skip


def device_time(measured: pd.DataFrame | None) -> pd.DataFrame:
    """Seconds and shares of each rank's kernel time; empty for a run directory."""
    if measured is None or measured.empty:
        return pd.DataFrame(columns=COLUMNS)
    m = measured
    kernel_us = m["kernel_time_us"].astype("float64").where(m["kernel_time_us"] > 0)
    idle_sum = (m["host_wait_us"] + m["kernel_wait_us"] + m["other_idle_us"]).astype("float64")
    idle_sum = idle_sum.where(idle_sum > 0)
    steps = m["steps"].astype("float64").clip(lower=1)
    launches = m["launches"].astype("float64")
    table = pd.DataFrame({
        "rank": m["rank"].astype("int64"),
        "kernel_time_s": kernel_us / 1e6,
        "idle_share": m["idle_us"] / kernel_us,
        "compute_share": m["compute_us"] / kernel_us,
        "non_compute_share": m["non_compute_us"] / kernel_us,
        "comm_s": m["comm_us"] / 1e6,
        "comm_overlap": m["overlap"],
        "host_wait_share": m["host_wait_us"] / idle_sum,
        "kernel_wait_share": m["kernel_wait_us"] / idle_sum,
        "other_idle_share": m["other_idle_us"] / idle_sum,
        "device_host_wait_share": m["device_host_wait_us"] / kernel_us,
        "steps": m["steps"].astype("int64"),
        "step_s": kernel_us / steps / 1e6,
        "host_wait_per_step_s": m["device_host_wait_us"] / steps / 1e6,
        "host_gaps_per_step": m["device_host_gaps"] / steps,
        "device_queued_wait_share": m["device_queued_wait_us"] / kernel_us,
        "queued_wait_per_step_s": m["device_queued_wait_us"] / steps / 1e6,
        "longest_queued_gap_s": m["device_longest_queued_gap_us"] / 1e6,
        "kernels_per_step": m["kernels"] / steps,
        "kernel_median_us": m["kernel_median_us"].astype("float64"),
        "launch_mean_us": m["launch_us"] / launches.where(launches > 0),
        "launch_per_step_s": m["launch_us"] / steps / 1e6,
        "sync_calls_per_step": m["sync_calls"] / steps,
        "scalar_reads_per_step": m["scalar_reads"] / steps,
        "sync_per_step_s": m["sync_us"] / steps / 1e6,
        "loader_per_step_s": m["loader_us"] / steps / 1e6,
        "graph_launches": m["graph_launches"].astype("int64"),
    })  # fmt: skip
    table = table.replace([np.inf, -np.inf], np.nan)
    return table.sort_values("rank").reset_index(drop=True)
