"""What the host did to a rank: the training thread's CPU time and the time it was runnable but
not running (waiting in the scheduler's run queue), the process's involuntary context switches,
the host's load average, the cores this process may run on (docs/run-format.md, "Host").

A rank on an oversubscribed or loaded host is slow because it waits for a core, not because it
computes or communicates more; without these numbers that time reads as compute, as
communication not hidden, or as a training trend. Each reading costs about two microseconds
(a vDSO clock, one `pread` of a file kept open, one `getrusage`), taken at step boundaries
only. The communication threads' own run-queue wait is not summed: listing and reading every
thread's file costs ~100 us a step; the ranks per host against the usable cores (in the
manifest) say when they must share cores.

Linux's `/proc/thread-self/schedstat` holds the thread's time on a CPU and its time waiting in
the run queue, in ns; it is opened once on the training thread (the file is bound to the thread
that opens it). Where it or any other source is missing (another OS, a sandbox), the field is
None and the analysis says the host could not be checked: never an error.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from collectors.safety import report_once

SCHEDSTAT = "/proc/thread-self/schedstat"


def usable_cores() -> int | None:
    """The cores this process may run on (its affinity mask), or the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def ranks_per_host() -> int | None:
    """The ranks torchrun starts on this host (LOCAL_WORLD_SIZE), when it says."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass(frozen=True)
class HostReading:
    """One reading of the counters (cumulative since the thread or process started)."""

    cpu_ns: int | None  # the training thread's CPU time
    runq_ns: int | None  # the training thread's time runnable but not running
    nivcsw: int | None  # the process's involuntary context switches


class HostSampler:
    """Counters of the thread that built it (the training thread), read at step boundaries."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self._fd = None  # not Linux, or /proc hidden: runq stays None

    def read(self) -> HostReading:
        try:
            return HostReading(
                cpu_ns=time.thread_time_ns(),
                runq_ns=self._thread_runq_ns(),
                nivcsw=resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
            )
        except Exception as err:  # a collector never fails training
            report_once("HostSampler.read", err)
            return HostReading(None, None, None)

    def _thread_runq_ns(self) -> int | None:
        if self._fd is None:
            return None
        return _runq_of(os.pread(self._fd, 100, 0))

    def step_fields(self, start: HostReading | None, end: HostReading) -> dict[str, Any]:
        """The step record's host fields: the counters' growth over the step, and the load."""
        fields = {name: _growth(getattr(start, name, None), getattr(end, name))
                  for name in ("cpu_ns", "runq_ns", "nivcsw")}  # fmt: skip
        try:
            fields["load1"] = os.getloadavg()[0]
        except (AttributeError, OSError):
            fields["load1"] = None
        return fields

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _runq_of(text: bytes) -> int | None:
    """The second of schedstat's three numbers (run-queue wait, ns), or None."""
    parts = text.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def _growth(start: int | None, end: int | None) -> int | None:
    if start is None or end is None:
        return None
    return max(end - start, 0)
