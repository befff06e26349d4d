"""Device time of profiler traces in HTA's terms (kernel time, idle, compute, communication and
its overlap), per rank (diag/kineto/device.py measures it)."""

from __future__ import annotations

import pandas as pd

DEVICE_TIME_EVENT = "device_time"  # written by diag/kineto/files.py


def device_time(events: pd.DataFrame) -> pd.DataFrame:
    rows = events[events["name"] == DEVICE_TIME_EVENT]
    columns = ["rank", "kernel_time_s", "idle_share", "compute_share", "non_compute_share",
               "comm_s", "comm_overlap"]  # fmt: skip
    table = []
    for rank, fields in zip(rows["rank"], rows["fields"], strict=True):
        kernel_us = fields.get("kernel_time_us") or float("nan")
        table.append({
            "rank": int(rank),
            "kernel_time_s": kernel_us / 1e6,
            "idle_share": fields.get("idle_us", 0) / kernel_us,
            "compute_share": fields.get("compute_us", 0) / kernel_us,
            "non_compute_share": fields.get("non_compute_us", 0) / kernel_us,
            "comm_s": fields.get("comm_us", 0) / 1e6,
            "comm_overlap": fields.get("overlap"),
        })  # fmt: skip
    return pd.DataFrame(table, columns=columns).sort_values("rank").reset_index(drop=True)
