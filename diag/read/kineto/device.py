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

Over the same kept events: the idle time split by what it waited for (idle.py: host wait,
kernel wait, other, HTA's `get_idle_time_breakdown`), the CPU calls that starve a device
(host_calls.py), the median kernel's duration and how many steps the events cover.
"""

from __future__ import annotations

import dataclasses
import math
import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from diag.contract.limits import MAX_LAUNCHES_PER_KERNEL
from diag.numeric import intervals
from diag.read.kineto import device_arrays
from diag.read.kineto.host_calls import HostCalls, HostCallScan
from diag.read.kineto.idle import KERNEL_CATEGORIES, NO_IDLE, IdleSplit, idle_split
from diag.read.kineto.kernels import KernelClass, KernelPatterns

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
STEP_START = re.compile(r"^ProfilerStep#\d+")


@dataclass(frozen=True)
class DeviceTime:
    kernel_time_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_us: float
    overlap: float | None  # of communication by computation; None without communication
    # what the idle time waited for (idle.py): summed over streams, as HTA reports them
    host_wait_us: float = 0.0
    kernel_wait_us: float = 0.0
    other_idle_us: float = 0.0
    device_host_wait_us: float = 0.0  # of the device's own idle time, the host's (the cost)
    device_gaps: int = 0
    device_host_gaps: int = 0
    device_queued_wait_us: float = 0.0  # of the device's idle, with its next kernel launched
    device_longest_queued_gap_us: float = 0.0
    steps: int = 1  # ProfilerSteps the kept events cover (1: the whole trace)
    kernels: int = 0  # kernels (category `kernel`) kept
    kernel_median_us: float | None = None
    # the CPU's calls over the same steps (host_calls.py)
    sync_calls: int = 0
    sync_us: float = 0.0
    scalar_reads: int = 0
    launches: int = 0
    launch_us: float = 0.0
    graph_launches: int = 0
    loader_us: float = 0.0

    def shares(self) -> dict[str, float]:
        total = self.kernel_time_us or math.nan
        return {
            "idle": self.idle_us / total,
            "compute": self.compute_us / total,
            "non_compute": self.non_compute_us / total,
        }


DEVICE_TIME_FIELDS = tuple(f.name for f in dataclasses.fields(DeviceTime))
"""The columns of `RunData.device_time` besides `rank`."""


def number_of(value: Any, default: float = -1) -> float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return default if isinstance(value, float) and math.isnan(value) else value
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


class DeviceScan:
    """What the device time needs of a trace's events, gathered a batch at a time by the
    one loop over the events (one_pass.take, which fills the converter's `Scan` beside it)."""

    def __init__(self) -> None:
        self.whole_us = True  # HTA rounds every event when any timestamp is fractional (or missing)
        self.cpu_start = array("d")
        self.cpu_correlation: list[Any] = []
        self.step_starts: dict[str, float] = {}  # ProfilerStep name -> its latest CPU start
        self.device = device_arrays.DeviceEvents()
        self.labels: dict[str, str] = {}  # one object for each kernel name and category
        self.host = HostCallScan()

    def result(self, patterns: KernelPatterns) -> DeviceTime | None:
        """The device time of the events added; None when none ran on the device."""
        measured = _measured(
            self.device, self.cpu_start, self.cpu_correlation, self.step_starts, self.whole_us,
            patterns,
        )  # fmt: skip
        if measured is None:
            return None
        last = max(self.step_starts.values()) if len(self.step_starts) >= 2 else None
        calls: HostCalls = self.host.result(last)
        return dataclasses.replace(measured, **dataclasses.asdict(calls))


def _measured(
    device: device_arrays.DeviceEvents,
    cpu_start: array,
    cpu_correlation: list[Any],
    step_starts: dict[str, float],
    whole_us: bool,
    patterns: KernelPatterns,
) -> DeviceTime | None:
    if not device:
        return None
    found = device_arrays.inputs(device, cpu_start, cpu_correlation, step_starts, whole_us,
                                 patterns)  # fmt: skip
    if found is device_arrays.NOT_PLAIN:
        found = _inputs(device, cpu_start, cpu_correlation, step_starts, whole_us, patterns)
    if found is None:
        return None
    starts, ends, classes, is_kernel, idle = found
    durations = (ends - starts)[is_kernel]
    spans = np.column_stack([starts, ends])
    kernel_time = float(ends.max() - starts.min())
    busy = intervals.union_length(spans)
    compute = intervals.merge(spans[classes == KernelClass.COMPUTE.value])
    comm = intervals.merge(spans[classes == KernelClass.COMM.value])
    compute_us, comm_us = _length(compute), _length(comm)
    overlap_us = comm_us - intervals.subtract(comm, compute)
    return DeviceTime(
        kernel_time_us=kernel_time,
        idle_us=kernel_time - busy,
        compute_us=compute_us,
        non_compute_us=busy - compute_us,
        comm_us=comm_us,
        overlap=overlap_us / comm_us if comm_us > 0 else None,
        **dataclasses.asdict(idle),
        steps=max(len(step_starts) - 1, 1),
        kernels=len(durations),
        kernel_median_us=float(np.median(durations)) if len(durations) else None,
    )


def _inputs(
    device: device_arrays.DeviceEvents,
    cpu_start: array,
    cpu_correlation: list[Any],
    step_starts: dict[str, float],
    whole_us: bool,
    patterns: KernelPatterns,
) -> device_arrays.Inputs | None:
    """`device_arrays.Inputs` event by event (any values; `device_arrays.inputs` takes the
    plain ones)."""
    correlations: Sequence[Any] = device.correlation
    names: Sequence[str] = device.name
    kinds: Sequence[str] = device.kind
    streams: Sequence[Any] = device.stream
    starts = np.array(device.ts, dtype=float)
    ends = starts + np.array(device.dur, dtype=float)
    if not whole_us:
        starts, ends = np.ceil(starts), np.floor(ends)
    keep = _launches_before_last_step(
        cpu_start, cpu_correlation, step_starts, correlations, whole_us
    )
    if keep is not None:
        starts, ends = np.repeat(starts, keep), np.repeat(ends, keep)
        index = np.repeat(np.arange(len(keep)), keep).tolist()
        if not index:
            return None
        correlations, names, kinds, streams = (
            tuple(map(column.__getitem__, index))
            for column in (correlations, names, kinds, streams)
        )
    launches = _launch_starts(cpu_start, cpu_correlation, step_starts, whole_us)
    idle = _idle(kinds, correlations, streams, starts, ends, launches)
    is_kernel = np.array([k == "kernel" for k in kinds], dtype=bool)
    return starts, ends, patterns.classify(names, kinds), is_kernel, idle


def _launch_starts(
    cpu_start: array, cpu_correlation: list[Any], step_starts: dict[str, float], whole_us: bool
) -> dict[Any, float]:
    """Per correlation id, the start of the last CPU event with it before the last step."""
    cpu = np.array(cpu_start, dtype=float)
    if not whole_us:
        cpu = np.ceil(cpu)
    if len(step_starts) >= 2:
        last = max(step_starts.values())
        kept = (cpu < (last if whole_us else math.ceil(last))).tolist()
    else:
        kept = [True] * len(cpu)
    wanted = [ok and c != -1 for c, ok in zip(cpu_correlation, kept, strict=True)]
    # a later event of an id replaces an earlier one, as assigning each in turn does
    return dict(compress(zip(cpu_correlation, cpu.tolist(), strict=True), wanted))


def _idle(
    kinds: Sequence[str],
    correlations: Sequence[Any],
    streams: Sequence[Any],
    starts: np.ndarray,
    ends: np.ndarray,
    launch_of: dict[Any, float],
) -> IdleSplit:
    """The idle split over the kept kernels, each with the start of the CPU call that launched
    it: the last CPU event with its correlation id (before the last step, as the kernels kept)."""
    mine = np.array([k in KERNEL_CATEGORIES for k in kinds], dtype=bool)
    if not mine.any():
        return NO_IDLE
    launched = np.array([launch_of.get(c, math.nan) for c in correlations], dtype=float)
    return idle_split(np.array(streams, dtype=float)[mine], starts[mine], ends[mine],
                      launched[mine])  # fmt: skip


def _launches_before_last_step(
    cpu_start: array,
    cpu_correlation: list[Any],
    step_starts: dict[str, float],
    device_correlation: Sequence[Any],
    whole_us: bool,
) -> list[int] | None:
    """How many times to count each device event: once per CPU event with its correlation id
    that starts before the last ProfilerStep; None (all, once) with fewer than two steps."""
    if len(step_starts) < 2:
        return None
    last_start = max(step_starts.values())
    starts = np.array(cpu_start, dtype=float)
    if not whole_us:
        starts, last_start = np.ceil(starts), math.ceil(last_start)
    launches = Counter(compress(cpu_correlation, (starts < last_start).tolist()))
    return [min(launches.get(c, 0), MAX_LAUNCHES_PER_KERNEL) for c in device_correlation]


def _length(merged: np.ndarray) -> float:
    return float((merged[:, 1] - merged[:, 0]).sum()) if len(merged) else 0.0
