"""What a slow rank's extra time was: compute, or time outside compute (a sleep, a blocking read,
a lock). A finding says "computes" only where the evidence shows the extra time used a core or
the device (issue 41): the step records carry the training thread's CPU time (`cpu_ns`), a
profiler trace its kernels' time.

On a CPU run a rank that computes longer spends that much more CPU time in the step; one that
sleeps or blocks does not. On a GPU the training thread's CPU time says nothing of the device's
work (it may block or spin in a synchronisation), so only the kernels' time can tell there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag.metrics import RunMetrics

COMPUTE_SHARE = 0.5
"""The part of the extra busy time the extra CPU (or device) time must reach to be compute."""
COMPUTES = "computes"
OUTSIDE = "waits outside compute"
UNKNOWN = "is busy"


@dataclass(frozen=True)
class ExtraTime:
    """What one rank's extra time per step was (`verb`: COMPUTES, OUTSIDE or UNKNOWN) and the
    figures that say so."""

    verb: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def phrase(self) -> str:
        """`computes 2.32x its peers' busy time`-ready: the verb as a title says it."""
        return {OUTSIDE: "sleeps or blocks outside compute"}.get(self.verb, self.verb)


def extra_time(
    metrics: RunMetrics, device_type: str | None, rank: int, peers: list[int], excess_s: float
) -> ExtraTime:
    """What `rank`'s `excess_s` per step over `peers` (its busy time's) was, on a run of
    `device_type` (the manifest's; None: unknown)."""
    if excess_s <= 0:
        return ExtraTime(UNKNOWN)
    device_type = device_type or ""
    device = _device_excess_s(metrics, rank, peers)
    if device is not None:
        return _judged(device, excess_s, "device_excess_per_step_s")
    cpu = _cpu_excess_s(metrics.host_steps, rank, peers)
    if cpu is not None and device_type in ("", "cpu"):
        return _judged(cpu, excess_s, "cpu_excess_per_step_s")
    return ExtraTime(UNKNOWN)


def _judged(used_s: float, excess_s: float, name: str) -> ExtraTime:
    verb = COMPUTES if used_s >= COMPUTE_SHARE * excess_s else OUTSIDE
    return ExtraTime(verb, {name: used_s, "busy_excess_per_step_s": excess_s})


def _cpu_excess_s(on_host: pd.DataFrame, rank: int, peers: list[int]) -> float | None:
    """The training thread's CPU time per step of `rank` over its peers' median; None where a
    rank's CPU time is not recorded."""
    if on_host.empty or "cpu_s" not in on_host:
        return None
    mean = on_host.groupby("rank")["cpu_s"].mean()
    others = [p for p in peers if p != rank]
    if rank not in mean.index or not others or mean.reindex([rank, *others]).isna().any():
        return None
    return float(mean[rank] - np.median(mean[others].to_numpy(float)))


def _device_excess_s(metrics: RunMetrics, rank: int, peers: list[int]) -> float | None:
    """The compute kernels' time per step of `rank` over its peers' median, from a profiler
    trace's device time; None without one. Not the kernel time (HTA's: the device's window,
    idle included) nor every kernel's: a peer's NCCL kernel spins while it waits for the
    straggler, so all ranks' windows and kernels last as long, and only computation tells
    the one that worked longer."""
    table = metrics.device
    if table is None or table.empty or not len(metrics.ranks):
        return None
    by_rank = table.set_index("rank")
    kernels = by_rank["kernel_time_s"] * by_rank["compute_share"]
    steps = metrics.ranks.set_index("rank")["steps"]
    others = [p for p in peers if p != rank]
    per_step = (kernels / steps.reindex(kernels.index)).reindex([rank, *others])
    if not others or per_step.isna().any():
        return None
    return float(per_step[rank] - np.median(per_step[others].to_numpy(float)))
