"""Device time of one rank in HTA's terms, computed by diag: kernel time, idle, compute,
non-compute, and the share of communication overlapped by computation.

The definitions follow HTA's (`get_temporal_breakdown`, `get_comm_comp_overlap`), so the two
tools can be checked against each other on the same traces:
- the device events are those with a stream and a correlation id (kernels, copies, sets);
- with two or more `ProfilerStep`s, the last step is left out: CPU events from the last step's
  start on are dropped, and device events are kept only if their correlation id belongs to a
  kept CPU event (its launch);
- when the trace writes fractional timestamps, each event is cut to whole microseconds
  (start rounded up, end rounded down), as HTA does;
- kernel time = last end - first start; idle = kernel time - |union of all device events|;
  compute = |union of computation kernels|; non-compute = the rest;
  overlap = |union(comm) & union(compute)| / |union(comm)|.
Computation and communication are diag's classes (`KernelPatterns`): with `HTA_PATTERNS` the
numbers are HTA's; with the defaults, custom all-to-all kernels (DeepEP) are communication,
where HTA counts them as computation.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from diag import intervals
from diag.kineto.kernels import KernelClass, KernelPatterns

HTA_PATTERNS = KernelPatterns(
    comm=(r"^nccl", r"^hip", r"^hccl", r"ncclKernel"),
    memory=(r"^(?:hip)?Memcpy", r"^(?:hip)?Memset", r"^dma"),
    other=(r"^nccl", r"Memcpy", r"Memset", r"dma", r"^.*Sync", r"^Stream Wait Event",
           r"cuda.*LaunchKernel", r"^runFunction", r"^hip", r"^job_exe", r"^packet",
           r"^pe_exe", r"^cpum_exe_subgraph", r"^hccl", r"^collective_subgraph_execution"),
    by_category=False,
)  # fmt: skip
"""HTA's classification (it matches names only, anchored at the start): NCCL names are its
only communication; names on its list of non-computation that are neither are "other"."""
_STEP = re.compile(r"^ProfilerStep#\d+")
_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})


@dataclass(frozen=True)
class DeviceTime:
    kernel_time_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_us: float
    overlap: float | None  # of communication by computation; None without communication

    def shares(self) -> dict[str, float]:
        total = self.kernel_time_us or math.nan
        return {
            "idle": self.idle_us / total,
            "compute": self.compute_us / total,
            "non_compute": self.non_compute_us / total,
        }


def _number(value: Any, default: float = -1) -> float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return default if isinstance(value, float) and math.isnan(value) else value
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def device_time(events: list[Any], patterns: KernelPatterns) -> DeviceTime | None:
    """The rank's device time over its kept events; None when it has no device events."""
    records = [e for e in events if isinstance(e, dict)]
    whole_us = all(type(e.get("ts")) is int for e in records)  # else HTA rounds every event
    timed = [e for e in records if e.get("dur") is not None and e.get("ts") is not None
             and e.get("cat") not in (None, "Trace")]  # fmt: skip
    cpu: list[tuple[float, Any, str]] = []  # (start, correlation, name)
    device: list[tuple[float, float, Any, str, str]] = []  # (start, end, corr, name, category)
    for event in timed:
        args: dict[str, Any] = event["args"] if isinstance(event.get("args"), dict) else {}
        start, end = float(event["ts"]), float(event["ts"]) + float(event["dur"])
        if not whole_us:
            start, end = math.ceil(start), math.floor(end)
        name, correlation = str(event.get("name", "")), args.get("correlation", -1)
        stream = _number(args.get("stream", -1))
        if (stream >= 0 and _number(correlation) >= 0) or name in _SYNC_NAMES:
            if stream >= 0:
                device.append((start, end, correlation, name, str(event.get("cat"))))
        else:
            cpu.append((start, correlation, name))
    device = _launched_before_last_step(cpu, device)
    if not device:
        return None
    kinds = patterns.classify([d[3] for d in device], [d[4] for d in device])
    spans = np.array([(d[0], d[1]) for d in device], dtype=float)
    kernel_time = float(spans[:, 1].max() - spans[:, 0].min())
    busy = intervals.union_length(spans)
    compute = intervals.merge(spans[kinds == KernelClass.COMPUTE.value])
    comm = intervals.merge(spans[kinds == KernelClass.COMM.value])
    compute_us = _length(compute)
    comm_us = _length(comm)
    overlap_us = comm_us - intervals.subtract(comm, compute)
    return DeviceTime(
        kernel_time_us=kernel_time,
        idle_us=kernel_time - busy,
        compute_us=compute_us,
        non_compute_us=busy - compute_us,
        comm_us=comm_us,
        overlap=overlap_us / comm_us if comm_us > 0 else None,
    )


def _length(merged: np.ndarray) -> float:
    return float((merged[:, 1] - merged[:, 0]).sum()) if len(merged) else 0.0


def _launched_before_last_step(
    cpu: list[tuple[float, Any, str]], device: list[tuple[float, float, Any, str, str]]
) -> list[tuple[float, float, Any, str, str]]:
    """Device events launched by CPU events that start before the last ProfilerStep (one copy
    per launching CPU event); all of them when the trace has fewer than two steps."""
    step_names = {name for _, _, name in cpu if _STEP.match(name)}
    if len(step_names) < 2 or not cpu:
        return device
    starts = [start for start, _, name in cpu if _STEP.match(name)]
    last_start = max(starts) if starts else min(start for start, _, _ in cpu)
    launches: dict[Any, int] = {}
    for start, correlation, _ in cpu:
        if start < last_start:
            launches[correlation] = launches.get(correlation, 0) + 1
    return [d for d in device for _ in range(launches.get(d[2], 0))]
