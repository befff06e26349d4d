"""Whether a rank waited for its own send: read from what its device did around the kernel.

A GPU send kernel spins from its launch until the receiver's kernel takes the message. The
rank's other streams go on meanwhile unless the program waits for the send (a blocking
`dist.send`, `req.wait()` before the next kernel): only then does its computation resume when
the send ends, with nothing else ending then that it could have waited for. A send with no
computation under it is not therefore the rank's wait: the device may be idle for another
reason (a receive it needs next, the pipeline's bubble) while the message waits for a late
receiver; in a pipeline a send and the receive the rank needs next often end together (both
wait for the same neighbour), and then the receive is the wait. Counted as the sender's wait,
the replay would hold the sender until its receiver arrives, and a counterfactual that moves
the receiver would move the sender too: an interleaved pipeline's straggler cost read 37% low
so (benchmarks/kineto_equivalence.py)."""

from __future__ import annotations

import numpy as np

RESUME_WITHIN_NS = 10_000
"""The computation resumes within this of the send's end: it waited for something ending then."""


def send_waited(
    t0: np.ndarray, t1: np.ndarray, comm: np.ndarray, compute: np.ndarray
) -> np.ndarray:
    """Per communication kernel (`comm`: indices into t0/t1), whether the rank waited for it
    were it a send: its computation (`compute`: the indices of its computing and copying
    kernels) resumes when it ends, and no other communication kernel ends then. Vectorised
    over one rank's step."""
    if len(comm) == 0:
        return np.zeros(0, dtype=bool)
    starts = np.sort(t0[compute]) if len(compute) else np.zeros(0, dtype=np.int64)
    ends = np.sort(t1[comm])
    s0, s1 = t0[comm], t1[comm]
    if len(starts) == 0:
        return np.zeros(len(comm), dtype=bool)
    first = np.minimum(np.searchsorted(starts, s0, side="right"), len(starts) - 1)
    resumes = (starts[first] > s0) & (np.abs(starts[first] - s1) <= RESUME_WITHIN_NS)
    ending_then = np.searchsorted(ends, s1 + RESUME_WITHIN_NS, side="right") - np.searchsorted(
        ends, s1 - RESUME_WITHIN_NS, side="left"
    )
    return resumes & (ending_then == 1)  # itself only
