"""The device's idle time split by what it waited for, as HTA defines it
(`get_idle_time_breakdown`), and the same split over the whole device.

On each stream, the kernels (Kineto categories `kernel`, `gpu_memcpy`, `gpu_memset`) in start
order; the gap before each one (its start minus the previous kernel's end on that stream) is
- host wait when the CPU launched the kernel (its runtime call's start, matched by correlation
  id) after the previous kernel had ended: the stream ran dry because the CPU had not yet
  enqueued the next kernel;
- kernel wait when it is not host wait and shorter than `KERNEL_WAIT_BELOW_US` (30 us, HTA's
  default `consecutive_kernel_delay`, in the trace's microseconds): the cost of launching
  back-to-back kernels;
- other otherwise (a kernel waiting on an event, another stream, a collective's peers).
Per rank the three are summed over the streams (HTA reports each stream; its shares are these
sums' shares). A stream's gaps overlap other streams' work, so these sums exceed the device's
own idle time; they say what the idle was, not how long the device was idle.

The device-level split (`device_host_wait_us`) reads the gaps of the union of every stream's
kernels instead, each judged by the kernel that ends it: launched after the gap began, the
whole device waited for its host. That is the time a step loses to the host, the cost of the
finding (diag/rules/families/host.py, HST002). Launched before the gap began, the device had
work queued and did not run it: it waited on a dependency the trace does not record (an event
of another stream or process, a CUDA graph's internal edge), `device_queued_wait_us`
(diag/rules/families/gpu_waits.py, HST003).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KERNEL_CATEGORIES = frozenset(
    {"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"}
)
"""The device events HTA's idle breakdown reads (synchronisation events are left out)."""
KERNEL_WAIT_BELOW_US = 30.0
"""HTA's `consecutive_kernel_delay` default: a gap below it, not host wait, is launch overhead."""


@dataclass(frozen=True)
class IdleSplit:
    host_wait_us: float  # summed over streams (HTA's host_wait)
    kernel_wait_us: float  # summed over streams (HTA's kernel_wait)
    other_idle_us: float  # summed over streams (HTA's other)
    device_host_wait_us: float  # gaps in every stream's work that the host left (the cost)
    device_gaps: int  # gaps in every stream's work
    device_host_gaps: int  # of those, the host's
    # gaps in every stream's work whose next kernel was already launched (not the host's): the
    # device had work and waited on a dependency the trace does not record
    device_queued_wait_us: float = 0.0
    device_longest_queued_gap_us: float = 0.0


NO_IDLE = IdleSplit(0.0, 0.0, 0.0, 0.0, 0, 0)


def idle_split(
    stream: np.ndarray, start: np.ndarray, end: np.ndarray, launched: np.ndarray
) -> IdleSplit:
    """The split over kernels given as arrays: stream id, start, end and the start of the CPU
    call that launched each (NaN: none in the trace, never host wait), in microseconds."""
    if len(start) == 0:
        return NO_IDLE
    totals = np.zeros(3)
    order = np.lexsort((start, stream))  # by stream, then start
    s, t0, t1, cpu = stream[order], start[order], end[order], launched[order]
    same = s[1:] == s[:-1]  # a gap only between two kernels of one stream
    gap = (t0[1:] - t1[:-1])[same]
    host = (cpu[1:] > t1[:-1])[same]  # NaN compares False: no launch, no host wait
    kernel = ~host & (gap < KERNEL_WAIT_BELOW_US)
    totals[0] = gap[host].sum()
    totals[1] = gap[kernel].sum()
    totals[2] = gap[~host & ~kernel].sum()
    gaps = _device_gaps(start, end, launched)
    return IdleSplit(
        host_wait_us=float(totals[0]),
        kernel_wait_us=float(totals[1]),
        other_idle_us=float(totals[2]),
        device_host_wait_us=gaps.host_us,
        device_gaps=gaps.count,
        device_host_gaps=gaps.host_count,
        device_queued_wait_us=gaps.queued_us,
        device_longest_queued_gap_us=gaps.longest_queued_us,
    )


@dataclass(frozen=True)
class DeviceGaps:
    """The gaps between the device's busy runs (every stream together)."""

    count: int
    host_count: int  # the next kernel was launched after the gap began: the host's
    host_us: float
    queued_us: float  # the next kernel was launched before the gap began: work was waiting
    longest_queued_us: float


def _device_gaps(start: np.ndarray, end: np.ndarray, launched: np.ndarray) -> DeviceGaps:
    """A gap is the host's when the first kernel after it was launched after the gap began (of
    kernels starting together, the one launched first); queued when it was launched before (a
    kernel without its launch in the trace is neither: nothing says when it was queued)."""
    order = np.lexsort((launched, start))
    t0, t1, cpu = start[order], end[order], launched[order]
    reach = np.maximum.accumulate(t1)
    opens = np.flatnonzero(t0[1:] > reach[:-1]) + 1  # kernels that end a gap
    if len(opens) == 0:
        return DeviceGaps(0, 0, 0.0, 0.0, 0.0)
    gap_start = reach[opens - 1]
    gap = t0[opens] - gap_start
    host = cpu[opens] > gap_start
    queued = cpu[opens] <= gap_start  # NaN compares False: an unknown launch is not queued
    return DeviceGaps(
        count=len(opens),
        host_count=int(host.sum()),
        host_us=float(gap[host].sum()),
        queued_us=float(gap[queued].sum()),
        longest_queued_us=float(gap[queued].max()) if queued.any() else 0.0,
    )
