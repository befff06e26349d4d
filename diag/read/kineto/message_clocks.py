"""Host clocks linked through point-to-point messages, where no collective links them.

A pipeline whose stages are whole hosts (its data-parallel groups inside a host) shares no
all-reduce between hosts: the only thing two stage-hosts' traces both see is a message, one
rank's send and its neighbour's receive. On a GPU both are NCCL kernels that spin until the
transfer is done, so they end together (within the microseconds the collectives' ends show),
whenever each was launched: the difference of their ends, read on the two hosts' clocks, is
the difference of the clocks (a receive's kernel cannot end before its send started, and
ends with it).

Which send is which receive comes from the trace, never from a group's name: the op's peer
(`Dst Rank` / `Src Rank`, PyTorch >= 2.5), and order: the k-th send of a step from rank a
to rank b in one process group is the k-th receive of that step on b from a in that group
(as batches.py pairs them). A link whose step holds as many sends as receives is paired;
any other is left unpaired (a trace cut inside a step).

Batched messages (Megatron's `batch_isend_irecv`: one SendRecv kernel runs several ops and
ends when the last is done; its ops keep the kernel's start, batches.py gives each its own
end) are read as kernels: the ops a rank's kernel ran (its point-to-point records with one
start) end with the kernel, the latest of their ends. Two kernels end together only where
they ran the same messages: a message is used where its send's kernel and its receive's
kernel each ran only messages between the two, as many on both sides (a 1F1B step's send of
an activation and receive of a gradient with the next stage). A batch that sends to one
neighbour and receives from the other (an interleaved schedule's) ends with whichever
transfer ends last, on either side: not used.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pandas as pd

from diag.contract import schema
from diag.numeric.ordering import dense_key, lexicographic, occurrence

SEND, RECV = schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value
P2P = (SEND, RECV)


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Messages whose two kernels end together: per message, the sender's and the receiver's
    rank and their kernels' ends (ns, each on its own host's clock); and the ranks of the
    point-to-point records that name a peer but were left unpaired or not used."""

    sender: np.ndarray
    receiver: np.ndarray
    send_end: np.ndarray
    recv_end: np.ndarray
    unused_ranks: frozenset[int]

    def __len__(self) -> int:
        return len(self.sender)


@dataclasses.dataclass(frozen=True)
class Link:
    """Messages between two sets of ranks on one clock each: `offset` ns, the median of the
    second set's ends minus the first's; `spread` ns, the median distance of the messages'
    differences from it; `messages`, how many."""

    offset: float
    spread: float
    messages: int


def message_pairs(comms: pd.DataFrame) -> Pairs:
    """The messages of `comms` (the run's comm table: rank, step, op, group, t0, t1, peer)
    whose send and receive are paired by peer and order and ran in kernels that end together."""
    p2p = comms[comms["op"].isin(P2P)]
    empty = np.zeros(0, dtype=np.int64)
    if p2p.empty or "peer" not in p2p:
        return Pairs(empty, empty, empty, empty, frozenset())
    rank = p2p["rank"].to_numpy(dtype=np.int64)
    t0 = p2p["t0"].to_numpy(dtype=np.int64)
    t1 = p2p["t1"].to_numpy(dtype=np.int64)
    end = _kernel_ends(rank, t0, t1)
    peer = pd.to_numeric(p2p["peer"], errors="coerce").to_numpy(dtype=np.float64, na_value=-1)
    named = (peer >= 0) & (peer < 2**31) & (peer != rank)
    send = (p2p["op"] == SEND).to_numpy(dtype=bool)
    group = pd.factorize(p2p["group"].astype(object), use_na_sentinel=False)[0]
    step = p2p["step"].to_numpy(dtype=np.int64)
    rows = np.flatnonzero(named)
    if len(rows) == 0:
        return Pairs(empty, empty, empty, empty, frozenset())
    other = peer[rows].astype(np.int64)
    source = np.where(send[rows], rank[rows], other)
    target = np.where(send[rows], other, rank[rows])
    _, link = np.unique(dense_key(group[rows], step[rows], source, target), return_inverse=True)
    # the n-th send on a link in a step is its n-th receive (ties at one start: record order)
    n = occurrence(dense_key(link, send[rows]), t0[rows])
    sends = np.bincount(link, weights=send[rows])
    receives = np.bincount(link, weights=~send[rows])
    balanced = (sends == receives)[link]
    order = lexicographic(link, n, send[rows])  # each message: its receive, then its send
    key = np.stack([link, n])[:, order]
    is_send = send[rows][order]
    pair = (key[:, 1:] == key[:, :-1]).all(axis=0) & ~is_send[:-1] & is_send[1:]
    pair &= balanced[order][1:]
    receive_of = np.full(len(rank), -1, dtype=np.int64)  # per row, the row across the link
    receive_rows, send_rows = rows[order[:-1][pair]], rows[order[1:][pair]]
    receive_of[send_rows], receive_of[receive_rows] = receive_rows, send_rows
    used = _ending_together(rank, t0, receive_of)
    used_sends = send_rows[used[send_rows]]
    unused = rank[named & ~used]
    return Pairs(
        sender=rank[used_sends],
        receiver=rank[receive_of[used_sends]],
        send_end=end[used_sends],
        recv_end=end[receive_of[used_sends]],
        unused_ranks=frozenset(np.unique(unused).tolist()),
    )


def _kernel_ends(rank: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Per record, the end of the kernel that ran it: the latest end of its rank's point-to-
    point records with its start (a batch's ops keep the kernel's start)."""
    kernel = dense_key(rank, t0)
    _, index = np.unique(kernel, return_inverse=True)
    latest = np.full(index.max() + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(latest, index, t1)
    return latest[index]


def _ending_together(rank: np.ndarray, t0: np.ndarray, across: np.ndarray) -> np.ndarray:
    """Per record, whether its kernel and its partner's kernel ran the same messages: every
    op of its kernel paired, with ops of one kernel on the other side, as many there."""
    _, kernel = np.unique(dense_key(rank, t0), return_inverse=True)
    size = np.bincount(kernel)
    paired = across >= 0
    fully = np.bincount(kernel, weights=~paired, minlength=len(size)) == 0
    partner = np.where(paired, kernel[np.maximum(across, 0)], -1)
    # one partner kernel each: the lowest and the highest of its ops' partners agree
    lowest = np.full(len(size), np.iinfo(np.int64).max, dtype=np.int64)
    highest = np.full(len(size), -1, dtype=np.int64)
    np.minimum.at(lowest, kernel, partner)
    np.maximum.at(highest, kernel, partner)
    one = fully & (lowest == highest) & (lowest >= 0)
    same_size = np.zeros(len(size), dtype=bool)
    same_size[one] = size[one] == size[lowest[one]]
    return paired & one[kernel] & same_size[kernel] & one[np.maximum(partner, 0)]


def links(
    pairs: Pairs, ranks: np.ndarray, clock: np.ndarray, offset: np.ndarray
) -> dict[tuple[int, int], Link]:
    """Per pair of clocks (a < b: `clock`, per rank of `ranks`, the set of ranks the
    collectives put on one clock), the offset of b's clock from a's that the messages between
    them show, each end first moved by its rank's offset within its own set (`offset`)."""
    if not len(pairs) or not len(ranks):
        return {}
    order = np.argsort(ranks, kind="stable")
    known = ranks[order]

    def where(of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = np.minimum(np.searchsorted(known, of), len(known) - 1)
        return order[at], known[at] == of

    send_at, send_known = where(pairs.sender)
    recv_at, recv_known = where(pairs.receiver)
    a, b = clock[send_at], clock[recv_at]
    across = send_known & recv_known & (a != b)
    if not across.any():
        return {}
    sent = pairs.send_end - offset[send_at]
    got = pairs.recv_end - offset[recv_at]
    low, high = np.minimum(a, b)[across], np.maximum(a, b)[across]
    difference = np.where(a < b, got - sent, sent - got)[across]  # high's clock minus low's
    frame = pd.DataFrame({"low": low, "high": high, "d": difference})
    median = frame.groupby(["low", "high"])["d"].transform("median")
    frame["distance"] = (frame["d"] - median).abs()
    table = frame.groupby(["low", "high"]).agg(
        offset=("d", "median"), spread=("distance", "median"), messages=("d", "size")
    )
    return {
        (int(lo), int(hi)): Link(float(row.offset), float(row.spread), int(row.messages))
        for (lo, hi), row in zip(table.index, table.itertuples(index=False), strict=True)
    }


def chained(
    found: dict[tuple[int, int], Link], root: int, min_messages: int
) -> dict[int, tuple[float, float]]:
    """Per clock reachable from `root` through links of at least `min_messages` messages, its
    offset from the root's clock and the uncertainty of that (the sum of the links' spreads on
    the way, the path of least uncertainty); the root's is (0, 0)."""
    neighbours: dict[int, list[tuple[int, float, float]]] = {}
    for (low, high), link in found.items():
        if link.messages < min_messages:
            continue
        neighbours.setdefault(low, []).append((high, link.offset, link.spread))
        neighbours.setdefault(high, []).append((low, -link.offset, link.spread))
    out: dict[int, tuple[float, float]] = {}
    queue: list[tuple[float, int, float]] = [(0.0, root, 0.0)]
    while queue:  # each clock settled once: at most as many rounds as links
        uncertainty, clock, offset = heapq.heappop(queue)
        if clock in out:
            continue
        out[clock] = (offset, uncertainty)
        for there, step, spread in neighbours.get(clock, []):
            if there not in out:
                heapq.heappush(queue, (uncertainty + spread, there, offset + step))
    return out
