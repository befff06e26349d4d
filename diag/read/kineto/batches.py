"""Each op of a batched point-to-point kernel given its own end and its own wait, read from
its peer's op on the other rank.

Megatron sends and receives through `batch_isend_irecv`: one `ncclDevKernel_SendRecv` runs
every op of the batch and ends when the last is done, so each op read from the kernel
(comm_ops.py) has the kernel's interval. In an interleaved schedule a batch sends to one
neighbour and receives from the other: the receive the rank waits for may end long before a
send that waits for a late receiver, and the rank computes meanwhile. Read as one interval,
the rank waited for the late receiver too, and a counterfactual that moves that receiver
moves this rank with it (the straggler's cost read 28% low, benchmarks/kineto_equivalence.py).

Where the ops name their peers (`Dst Rank` / `Src Rank`, PyTorch >= 2.5), the k-th send of a
step from rank a to rank b in a process group is the k-th receive of that step on b from a in
that group. A message moves once
both its ops have started: the batch waited from its start until the last of its ops' peers
started (the last member's start), and the rest of the kernel is transfer. So each op ends
the transfer after the later of its own start and its peer's, and the kernel's end is its
latest op's. A receive stays its rank's wait; a send is one only where the rank's computation
did not resume before the send's end (the rank waited for the whole batch, as Megatron's
`wait_on_reqs` does), else the rank launched it and went on.

An op whose peer left no trace (a lost rank's) takes its peer op from the lost rank's
lockstep stand-in where it has one (its TP partner's op on the link to or from the same
stage, diag/contract/peers.py). Kept whole, the batch of an interleaved schedule's last
stage, a receive from the lost rank beside a send to the first stage, read that send as
15 ms of transfer after the first stage's receive had started, and the replay of the step
was 55% long. Where nobody stands for the lost rank, the batch is split where its other
ops' peers are known: each of those ends a typical transfer (the median of the batches
whose every peer is known, for its size) after it and its peer both started, and the ops
with no known peer keep the kernel's end (what held the kernel past the others was
theirs). Where no batch of that size has every peer known, or no op has, the batch keeps
the kernel's interval.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diag.contract import schema
from diag.numeric.ordering import dense_key, lexicographic, occurrence

KERNEL_KEY = "kernel"
"""A record's key (dropped by `split_batches`): the index, on its rank, of the kernel that
ran it, where that kernel ran several ops (a batch)."""
RESUME_KEY = "resume"
"""A batched record's key (dropped by `split_batches`): when the rank's next computing kernel
after the batch's start started (ns; None: none in the step)."""
RESUME_WITHIN_NS = 10_000
"""A computation that started this much before a send's end at the latest waited for it."""
SEND, RECV = schema.CollectiveOp.SEND.value, schema.CollectiveOp.RECV.value


def split_batches(
    comms: list[dict[str, Any]], stand_ins: dict[tuple[int, int], tuple[int, int]] | None = None
) -> int:
    """Give each op of a batched kernel its own end and wait (in place, `comms`: every
    rank's comm records); drop the keys the conversion left for this. The number of
    batches split. `stand_ins`: (untraced rank, its traced neighbour) -> the link whose
    messages stand for theirs (`peers.stand_in_links`)."""
    batched = [i for i, c in enumerate(comms) if c.get(KERNEL_KEY) is not None]
    if not batched:
        return 0
    messages = [i for i, c in enumerate(comms)
                if c.get("op") in (SEND, RECV) and _rank(c.get("peer")) is not None]  # fmt: skip
    partner_start = _partner_starts(comms, messages, stand_ins or {})
    batches = _batches(comms, batched)
    typical = _typical_transfers(comms, batches, partner_start)
    split = 0
    for batch in batches:
        split += _split(comms, batch, partner_start, typical)
    for i in batched:
        comms[i].pop(KERNEL_KEY, None)
        comms[i].pop(RESUME_KEY, None)
    return split


def _rank(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _partner_starts(
    comms: list[dict[str, Any]],
    messages: list[int],
    stand_ins: dict[tuple[int, int], tuple[int, int]],
) -> dict[int, int]:
    """For each send and receive that names its peer (index into `comms`), the start of the
    other side's op: the n-th, by start, of the step's messages on its link in its group;
    where the peer left no trace and has a lockstep stand-in (`stand_ins`), the n-th
    opposite op on the link that stands for theirs (the partner's, to or from the same
    stage: it sent and received when the peer did)."""
    if not messages:
        return {}
    rows = np.asarray(messages, dtype=np.int64)
    rank = np.array([comms[i]["rank"] for i in messages], dtype=np.int64)
    peer = np.array([comms[i]["peer"] for i in messages], dtype=np.int64)
    step = np.array([comms[i]["step"] for i in messages], dtype=np.int64)
    start = np.array([comms[i]["t0"] for i in messages], dtype=np.int64)
    send = np.array([comms[i]["op"] == SEND for i in messages], dtype=bool)
    codes: dict[Any, int] = {}
    group = np.array([codes.setdefault(comms[i].get("group"), len(codes)) for i in messages],
                     dtype=np.int64)  # fmt: skip
    source, target = np.where(send, rank, peer), np.where(send, peer, rank)
    # ties at one start (one batch's ops): in record order, as each rank issued them
    n = occurrence(dense_key(send, group, step, source, target), start)
    by_message = lexicographic(group, step, source, target, n, send)  # its receive, its send
    key = np.stack([group, step, source, target, n])[:, by_message]
    is_send = send[by_message]
    pair = (key[:, 1:] == key[:, :-1]).all(axis=0) & ~is_send[:-1] & is_send[1:]
    receives, sends = by_message[:-1][pair], by_message[1:][pair]
    out = dict(zip(rows[receives].tolist(), start[sends].tolist(), strict=True))
    out.update(zip(rows[sends].tolist(), start[receives].tolist(), strict=True))
    if stand_ins:
        out.update(_stand_in_starts(rows, np.stack([send, group, step, source, target, n]),
                                    start, rank, peer, stand_ins))  # fmt: skip
    return out


def _stand_in_starts(
    rows: np.ndarray,
    key: np.ndarray,
    start: np.ndarray,
    rank: np.ndarray,
    peer: np.ndarray,
    stand_ins: dict[tuple[int, int], tuple[int, int]],
) -> dict[int, int]:
    """For each message whose peer x left no trace (row of `rows`), the start of the op its
    lockstep stand-in y took on the link standing for theirs: a receive on b from x, y's
    send to b' (y's neighbour on b's side); a send from b to x, y's receive from b'.
    `key`: (is send, group, step, source, target, n) per message."""
    at = {tuple(column): i for i, column in enumerate(key.T.tolist())}
    out: dict[int, int] = {}
    for i in range(len(rows)):
        link = stand_ins.get((int(peer[i]), int(rank[i])))
        if link is None:
            continue
        y, other = link
        is_send, group, step, _, _, n = key[:, i].tolist()
        # the opposite op on the standing link: y -> other for a receive, other -> y for a send
        source, target = (other, y) if is_send else (y, other)
        found = at.get((1 - is_send, group, step, source, target, n))
        if found is not None:
            out[int(rows[i])] = int(start[found])
    return out


def _batches(comms: list[dict[str, Any]], batched: list[int]) -> list[list[int]]:
    """The batched records grouped by the kernel that ran them (rank, kernel index)."""
    found: dict[tuple[Any, Any], list[int]] = {}
    for i in batched:
        found.setdefault((comms[i].get("rank"), comms[i][KERNEL_KEY]), []).append(i)
    return list(found.values())


def _typical_transfers(
    comms: list[dict[str, Any]], batches: list[list[int]], partner_start: dict[int, int]
) -> dict[int | None, int]:
    """Per message size (bytes, None where unknown), the median transfer of the batches whose
    every op's peer op is known: the kernel's end less the last of its ops' meeting (both
    sides started), taken for each op of the batch."""
    found: dict[int | None, list[int]] = {}
    for batch in batches:
        if len(batch) < 2 or any(i not in partner_start for i in batch):
            continue
        first, end = int(comms[batch[0]]["t0"]), int(comms[batch[0]]["t1"])
        last = max(max(first, partner_start[i]) for i in batch)
        if last > end:  # the peers' clocks disagree with this one: no transfer read
            continue
        for i in batch:
            found.setdefault(_size(comms[i]), []).append(end - last)
    return {size: int(np.median(times)) for size, times in found.items()}


def _size(comm: dict[str, Any]) -> int | None:
    """The op's bytes; None where the trace does not give them (NaN, absent)."""
    size = comm.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size):
        return None
    return int(size)


def _split(
    comms: list[dict[str, Any]],
    batch: list[int],
    partner_start: dict[int, int],
    typical: dict[int | None, int],
) -> int:
    """One batch's ops their own ends and waits, where every op's peer op is known; where
    only some are, those a typical transfer after they met (`typical`, by size) and the
    others the kernel's end. Whether each send was awaited is read either way (1: the batch
    was split, 0: its ops kept the kernel's interval)."""
    if len(batch) < 2:
        return 0
    kernel = (int(comms[batch[0]]["t0"]), int(comms[batch[0]]["t1"]))  # before any is split
    split = _ends_from_peers(comms, batch, partner_start, typical, kernel)
    split |= _receives_until_resumed(comms, batch, partner_start, kernel)
    _sends_awaited(comms, batch)
    return int(split)


def _receives_until_resumed(
    comms: list[dict[str, Any]],
    batch: list[int],
    partner_start: dict[int, int],
    kernel: tuple[int, int],
) -> bool:
    """Each receive of the batch whose peer's op is unknown (it keeps the kernel's end) ends
    at the latest when the rank computed again (`RESUME_KEY`): a rank does not compute
    past a receive it waits for, so where it computed before the kernel's end, the receive
    was done by then or not awaited there (an interleaved schedule posts the next chunk's
    receive beside a send and goes on). Held to the kernel's end, a first stage's receive
    from a lost last stage, batched with a send to a slow next stage, held its rank 20 ms
    past its computing, and the replay of the step was 21% long. Whether any was cut."""
    resume = comms[batch[0]].get(RESUME_KEY)
    first, end = kernel
    if type(resume) is not int or not first <= resume < end:
        return False
    cut = False
    for i in batch:
        if comms[i]["op"] == RECV and i not in partner_start and comms[i]["t1"] > resume:
            comms[i]["t1"] = resume
            cut = True
    return cut


def _ends_from_peers(
    comms: list[dict[str, Any]],
    batch: list[int],
    partner_start: dict[int, int],
    typical: dict[int | None, int],
    kernel: tuple[int, int],
) -> bool:
    """Each op of the batch its end from its peer's op where it can be read (`_split`;
    `kernel`: the batch's start and end); whether any was."""
    known = [i for i in batch if i in partner_start]
    if not known:
        return False
    first, end = kernel
    met = {i: max(first, partner_start[i]) for i in known}  # both sides there
    if len(known) < len(batch):
        if any(_size(comms[i]) not in typical for i in known):
            return False
        for i in known:
            comms[i]["t1"] = min(end, met[i] + typical[_size(comms[i])])
        return True
    last = max(met.values())
    transfer = max(end - last, 0)
    for i in batch:
        comms[i]["t1"] = min(end, met[i] + transfer) if last <= end else min(end, met[i])
    return True


def _sends_awaited(comms: list[dict[str, Any]], batch: list[int]) -> None:
    """Whether each send of a batch with a receive was awaited apart (`blocking`) or
    launched (`async`). The receive made the kernel the rank's wait; a send is part of it
    where it ends last and the rank computed nothing before its end. One that ends with or
    before a receive is covered by the wait for that receive (the computation resuming then
    says nothing of the send): launched, not awaited apart. So is each send of a batch
    kept whole (its peers unknown, a lost node's): read as awaited, a send to the lost rank
    was a place of the step its traced peers' batches did not have, and the ranks of its
    stage were compared place by place out of step (a slow stage beside the lost node read
    11 ms of its 115)."""
    received = [int(comms[i]["t1"]) for i in batch if comms[i]["op"] == RECV]
    if not received:
        return  # sends only: the kernel's own reading says whether the rank waited
    resume = comms[batch[0]].get(RESUME_KEY)
    for i in batch:
        comm = comms[i]
        if comm["op"] != SEND:
            continue
        waited = comm["t1"] > max(received) + RESUME_WITHIN_NS and (
            resume is None or resume >= comm["t1"] - RESUME_WITHIN_NS
        )
        comm["blocking"], comm["async"] = waited, not waited
