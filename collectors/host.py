"""What the host did to a rank: the training thread's CPU time and the time it was runnable but
not running (waiting in the scheduler's run queue), the process's involuntary context switches,
the host's load average, the cores this process may run on (docs/run-format.md, "Host").

A rank on an oversubscribed or loaded host is slow because it waits for a core, not because it
computes or communicates more; without these numbers that time reads as compute, as
communication not hidden, or as a training trend. Each reading costs about two microseconds
(a vDSO clock, one `pread` of a file kept open, one `getrusage`), plus the whole process's
CPU time and its threads' run-queue wait (one listing of `/proc/self/task` and one `pread` a
thread, files kept open: ~10-30 us), taken at step boundaries only. The process's numbers
matter because a rank's collectives run on other threads (gloo's workers, NCCL's proxy): on an
oversubscribed host they wait for a core while the training thread sleeps in the wait.

Linux's `/proc/thread-self/schedstat` holds the thread's time on a CPU and its time waiting in
the run queue, in ns; it is opened once on the training thread (the file is bound to the thread
that opens it). Where it or any other source is missing (another OS, a sandbox), the field is
None and the analysis says the host could not be checked: never an error.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Any

from collectors.safety import report_once

SCHEDSTAT = "/proc/thread-self/schedstat"
TASKS = "/proc/self/task"
MAX_THREADS = 4096  # a process with more threads than this is not summed (bounded work)


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


@dataclass(frozen=True, kw_only=True)
class HostReading:
    """One reading of the counters (cumulative since the thread or process started)."""

    cpu_ns: int | None  # the training thread's CPU time
    runq_ns: int | None  # the training thread's time runnable but not running
    nivcsw: int | None  # the process's involuntary context switches
    proc_cpu_ns: int | None = None  # every thread's CPU time
    proc_runq_ns: dict[int, int] | None = None  # by thread id: its run-queue wait so far


OWN_THREADS: set[int] = set()
"""Native ids of the collectors' own threads (the watchdog, the SIGTERM helper): idle, not the
job's, and each would cost a read per sample, so `proc_runq_ns` leaves them out."""


def own_thread() -> None:
    """Called first thing by a collector's own thread: the host sampler leaves it out."""
    OWN_THREADS.add(threading.get_native_id())


class HostSampler:
    """Counters of the thread that built it (the training thread), read at step boundaries."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._task_fds: dict[int, int] = {}
        self._tasks_readable = os.path.isdir(TASKS)
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
                proc_cpu_ns=time.process_time_ns(),
                proc_runq_ns=self._threads_runq_ns(),
            )
        except Exception as err:  # a collector never fails training
            report_once("HostSampler.read", err)
            return HostReading(cpu_ns=None, runq_ns=None, nivcsw=None)

    def _thread_runq_ns(self) -> int | None:
        if self._fd is None:
            return None
        return _runq_of(os.pread(self._fd, 100, 0))

    def _threads_runq_ns(self) -> dict[int, int] | None:
        """Every thread's run-queue wait so far; threads are listed each time (they come and
        go), their files opened once."""
        if not self._tasks_readable:
            return None
        tids = {int(name) for name in os.listdir(TASKS) if name.isdigit()} - OWN_THREADS
        if len(tids) > MAX_THREADS:
            return None
        for gone in set(self._task_fds) - tids:
            with contextlib.suppress(OSError):
                os.close(self._task_fds.pop(gone))
        waits = {}
        for tid in tids:
            fd = self._task_fds.get(tid)
            try:
                if fd is None:
                    fd = self._task_fds[tid] = os.open(f"{TASKS}/{tid}/schedstat", os.O_RDONLY)
                wait = _runq_of(os.pread(fd, 100, 0))
            except OSError:
                continue  # the thread ended between the listing and the read
            if wait is not None:
                waits[tid] = wait
        return waits

    def step_fields(self, start: HostReading | None, end: HostReading) -> dict[str, Any]:
        """The step record's host fields: the counters' growth over the step, and the load."""
        fields: dict[str, Any] = {name: _growth(getattr(start, name, None), getattr(end, name))
                  for name in ("cpu_ns", "runq_ns", "nivcsw", "proc_cpu_ns")}  # fmt: skip
        fields["proc_runq_ns"] = _threads_growth(getattr(start, "proc_runq_ns", None),
                                                 end.proc_runq_ns)  # fmt: skip
        try:
            fields["load1"] = os.getloadavg()[0]
        except (AttributeError, OSError):
            fields["load1"] = None
        return fields

    def close(self) -> None:
        for fd in [self._fd, *self._task_fds.values()]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd, self._task_fds, self._tasks_readable = None, {}, False


def _runq_of(text: bytes) -> int | None:
    """The second of schedstat's three numbers (run-queue wait, ns), or None."""
    parts = text.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def _growth(start: int | None, end: int | None) -> int | None:
    if start is None or end is None:
        return None
    return max(end - start, 0)


def _threads_growth(start: dict[int, int] | None, end: dict[int, int] | None) -> int | None:
    """The run-queue wait the threads gained over the step (a thread born in it: all of its)."""
    if start is None or end is None:
        return None
    return sum(max(wait - start.get(tid, 0), 0) for tid, wait in end.items())
