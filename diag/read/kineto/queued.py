"""When a rank arrived at a collective whose kernel queued behind another communication kernel.

NCCL runs a process group's kernels one after another on its stream: a kernel launched while
the previous one still runs starts only when that one ends. DDP launches its gradient buckets'
all-reduces during the backward pass; when a peer is late the first bucket's kernel spins until
that peer arrives, and the buckets launched after it start, back to back, only once it ends.
Their kernels' starts are then the end of the wait in front of them, not when the rank was
ready: read as arrivals they put that wait into the rank's own time (its own next collective
"arrives late" because its peer did), and with no computation under the queued kernels they
read as collectives the rank blocks in, where its peer's same buckets read as launched during
backward. Both misreadings hide a straggler's cost behind its peers' queues.

A queued kernel's arrival is therefore when its rank could have joined: its launch, or where
the device ran behind the host at that launch (the computation launched before it had not
started yet), the end of that computation; never before the kernel it queued behind arrived
(that one runs first), nor after the kernel's own start.
Only a kernel of the same stream queues behind another (a process group's kernels share its
stream): a collective starting as another group's kernel ends (a tensor-parallel all-reduce
after a pipeline's receive) waited on its data, not in a queue. Kernels whose stream the trace
does not say are read as one stream.
"""

from __future__ import annotations

import numpy as np

from diag.contract import schema

MESSAGE_OPS = frozenset({schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value})
"""Ops whose kernels keep their starts: a message pairs with its peer's by them."""
QUEUE_TOLERANCE_NS = 20_000
"""A kernel starting within this of an earlier communication kernel's end, launched before that
end by more than this, queued behind it (a stream's next kernel starts a few us after the
previous one ends)."""


LOOKBACK = 8
"""The computation kernels launched last before a queued collective that are looked at: one not
started by the collective's launch (the device ran behind the host) ends before the collective
could run (a stream runs its kernels in launch order; the collective's input comes from them)."""


def queued_arrivals(
    t0: np.ndarray,
    t1: np.ndarray,
    launched: np.ndarray,
    comm: np.ndarray,
    compute: np.ndarray,
    stream: np.ndarray | None = None,
) -> np.ndarray:
    """Per kernel (int ns arrays `t0`, `t1`, its launch `launched`, its `stream`), when its
    rank arrived: `t0`, except for communication kernels (indices `comm`) that queued behind
    another of `comm` on their stream (module docstring), whose arrival is their launch, or the
    latest end of the computation (indices `compute`) launched last before it (LOOKBACK
    kernels) that had not started by that launch, and never before the arrival of the kernel
    it queued behind."""
    arrival = t0.copy()
    if stream is None or len(comm) < 2:
        return _queued(arrival, t0, t1, launched, comm, compute)
    for one in np.unique(stream[comm]).tolist():
        arrival = _queued(arrival, t0, t1, launched, comm[stream[comm] == one], compute)
    return arrival


def _queued(
    arrival: np.ndarray,
    t0: np.ndarray,
    t1: np.ndarray,
    launched: np.ndarray,
    comm: np.ndarray,
    compute: np.ndarray,
) -> np.ndarray:
    """`arrival` with the queued kernels among `comm` (one stream's) set."""
    if len(comm) < 2:
        return arrival
    # the latest end of the communication kernels that started before each one
    order = np.argsort(t0[comm], kind="stable")
    by_start = comm[order]
    reach = np.maximum.accumulate(t1[by_start])
    position = np.arange(len(by_start))
    # which kernel ends at the reach (the one each queued kernel waited behind): the latest
    ahead = np.maximum.accumulate(np.where(t1[by_start] == reach, position, 0))
    starts = t0[by_start]
    previous_end = np.r_[starts[0] - 2 * QUEUE_TOLERANCE_NS - 1, reach[:-1]]  # none: apart
    queued = (np.abs(starts - previous_end) <= QUEUE_TOLERANCE_NS) & (
        launched[by_start] < previous_end - QUEUE_TOLERANCE_NS
    )
    if not queued.any():
        return arrival
    rows = by_start[queued]
    ready = launched[rows].copy()
    # a kernel whose launch was not found reads its own start as its launch: no evidence
    compute = compute[launched[compute] < t0[compute]]
    if len(compute):
        by_launch = compute[np.argsort(launched[compute], kind="stable")]
        last = np.searchsorted(launched[by_launch], launched[rows], side="left") - 1
        for back in range(LOOKBACK):  # the computation launched last before each
            at = last - back
            has = at >= 0
            before = by_launch[np.maximum(at, 0)]
            behind = has & (t0[before] > launched[rows])  # the device had not reached it yet
            ready = np.where(behind, np.maximum(ready, t1[before]), ready)
    arrival[rows] = np.clip(ready, None, t0[rows])
    # and not before the kernel it queued behind arrived (that one runs first): in start order,
    # so that a queue's later kernels follow its earlier ones' arrivals
    for at in np.flatnonzero(queued).tolist():
        k, previous = by_start[at], by_start[ahead[at - 1]]
        arrival[k] = min(max(arrival[k], arrival[previous]), t0[k])
    return arrival
