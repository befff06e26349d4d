"""The device time's inputs from its scanned events in numpy, where the correlation ids are
the plain ints a profiler writes (issue 43: `device._inputs` looks each device event and
each CPU event up in Python dicts, a third of a trace's device-time cost on the simulated
folders).

The same values as `device._inputs`, by the same rules (tests/unit/test_kineto_one_pass.py
compares them on every real trace, simulated folders and random events):
- a device event is counted once per CPU event with its correlation id that starts before
  the last ProfilerStep (at most MAX_LAUNCHES_PER_KERNEL; with fewer than two steps, once):
  `np.unique` counts the ids, a sorted look-up reads each event's count;
- its launch is the last CPU event with its id before the last step (id -1: none): the last
  occurrence of each id, found as the first of the reversed ids;
- classes, kernel categories and `kernel` tested once per distinct (name, category) and
  category, then repeated as the events are.
Anything else (an id that is a float, a string read as a number, past int64) is `NOT_PLAIN`:
the caller's loops take it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diag.contract.limits import MAX_LAUNCHES_PER_KERNEL
from diag.read.kineto.idle import KERNEL_CATEGORIES, NO_IDLE, IdleSplit, idle_split
from diag.read.kineto.kernels import KernelPatterns


@dataclass
class DeviceEvents:
    """The device events a scan keeps (`device.DeviceScan.device`), a column each: start and
    duration (us) as doubles, as every reader takes them; the correlation id and stream as
    read (`device.number_of`); name and category one object each (the scan's labels). A
    tuple an event, with its two decoded numbers, held about 130 bytes more (about 13 MiB of
    a 79 MiB trace's parse)."""

    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    correlation: list[Any] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    stream: list[Any] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ts)

    def rows(self) -> list[tuple[float, float, Any, str, str, Any]]:
        """An event a tuple (start, duration, correlation, name, category, stream)."""
        columns = (self.ts, self.dur, self.correlation, self.name, self.kind, self.stream)
        return list(zip(*columns, strict=True))

    @classmethod
    def of(cls, rows: Iterable[tuple[float, float, Any, str, str, Any]]) -> DeviceEvents:
        """The columns of (start, duration, correlation, name, category, stream) tuples."""
        out = cls()
        for ts, dur, correlation, name, kind, stream in rows:
            out.ts.append(ts)
            out.dur.append(dur)
            out.correlation.append(correlation)
            out.name.append(name)
            out.kind.append(kind)
            out.stream.append(stream)
        return out


class _NotPlain:
    """The inputs are not plain ints (`inputs` returns it, the caller's loops take them)."""


NOT_PLAIN: Any = _NotPlain()

Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, IdleSplit]
"""What the device time is measured from: each kept device event's start and end (counted as
often as it was launched before the last step), its class, whether it is a `kernel`, and
the idle split."""


def inputs(
    device: DeviceEvents,
    cpu_start: array,
    cpu_correlation: list[Any],
    step_starts: dict[str, float],
    whole_us: bool,
    patterns: KernelPatterns,
) -> Inputs | Any | None:
    """`device._inputs` over arrays; NOT_PLAIN where an id is not a plain int."""
    correlations, names, kinds = device.correlation, device.name, device.kind
    if set(map(type, correlations)) != {int} or set(map(type, cpu_correlation)) - {int}:
        return NOT_PLAIN
    try:
        ids = np.array(correlations, dtype=np.int64)
        cpu_ids = np.array(cpu_correlation, dtype=np.int64)
    except OverflowError:
        return NOT_PLAIN
    starts = np.array(device.ts, dtype=float)
    ends = starts + np.array(device.dur, dtype=float)
    cpu = np.array(cpu_start, dtype=float)
    if not whole_us:
        starts, ends, cpu = np.ceil(starts), np.floor(ends), np.ceil(cpu)
    before = None  # CPU events before the last step (None: fewer than two steps, all)
    if len(step_starts) >= 2:
        last = max(step_starts.values())
        before = cpu < (last if whole_us else math.ceil(last))
    index = None  # each device event repeated as often as it was launched
    if before is not None:
        launched_ids, counts = np.unique(cpu_ids[before], return_counts=True)
        times = np.minimum(_looked_up(launched_ids, counts, ids, 0), MAX_LAUNCHES_PER_KERNEL)
        index = np.repeat(np.arange(len(ids)), times)
        if len(index) == 0:
            return None
    wanted = cpu_ids != -1 if before is None else before & (cpu_ids != -1)
    kept_ids, kept_starts = cpu_ids[wanted], cpu[wanted]
    reversed_ids, first_reversed = np.unique(kept_ids[::-1], return_index=True)
    last_start = kept_starts[len(kept_starts) - 1 - first_reversed]
    launched = _looked_up(reversed_ids, last_start, ids, math.nan).astype(float)
    category = {kind: (kind in KERNEL_CATEGORIES, kind == "kernel") for kind in set(kinds)}
    mine = np.array([category[kind][0] for kind in kinds], dtype=bool)
    is_kernel = np.array([category[kind][1] for kind in kinds], dtype=bool)
    classes = patterns.classify(names, kinds)
    stream = np.array(device.stream, dtype=float)
    if index is not None:
        starts, ends, classes = starts[index], ends[index], classes[index]
        is_kernel, mine, launched, stream = (
            is_kernel[index],
            mine[index],
            launched[index],
            stream[index],
        )
    idle = (
        idle_split(stream[mine], starts[mine], ends[mine], launched[mine]) if mine.any()
        else NO_IDLE
    )  # fmt: skip
    return starts, ends, classes, is_kernel, idle


def _looked_up(
    keys: np.ndarray, values: np.ndarray, wanted: np.ndarray, default: Any
) -> np.ndarray:
    """values[keys == w] for each w of `wanted` (`keys` sorted and distinct); `default` where
    none is."""
    if len(keys) == 0:
        return np.full(len(wanted), default)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return np.where(keys[at] == wanted, values[at], default)
