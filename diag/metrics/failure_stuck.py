"""The collectives ranks wait in (diag/metrics/failure.py): who waits, who never joined, and the
waiting ranks whose op, size or dtype differs from the most common one. A collective is
identified by its group and its sequence number in that group; the ranks that should join it
are its group's members (the record's `group_ranks`, the manifest's group that holds the
waiting ranks, the world for a group of its size, the dump's `pg_config`). From the records'
open state and, as a second witness, from the Flight Recorder dumps read beside the run.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from diag.metrics.common import NS_PER_S
from diag.metrics.failure_records import (
    MAX_OPEN_PER_RANK,
    Issued,
    RankRecords,
    Stuck,
    as_int,
    as_text,
)
from diag.read.load import RunData

P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "sendrecv"})
"""Point-to-point ops: a send pairs with a receive, so their op and place differ by design."""
SAME_SIZE_OPS = frozenset({"all_reduce", "allreduce", "broadcast", "reduce", "barrier"})
"""Collectives whose every member passes the same size; the others (all-to-all, uneven
gathers and scatters) may legitimately differ, and are compared by op and dtype only."""


def flight_recorder_ranks(run: RunData) -> set[int]:
    """The ranks whose dump was read (the table's where the run does not list them)."""
    table = run.flight_recorder
    listed = set(run.flight_recorder_ranks)
    if table is not None and not table.empty:
        listed |= {int(r) for r in table["rank"].unique()}
    return listed


def flight_recorder_issued(run: RunData) -> tuple[list[Issued], dict[tuple[int, str], int]]:
    """What the dumps say is in flight, as PyTorch's `fr_trace` reads them: per group, the
    first sequence number some members issued and others never reached (the members behind
    never joined it; gloo retires an entry that timed out, so an issued entry counts whatever
    its state), plus every entry still open; and each rank's last sequence number per group.
    A group's members are its `pg_config` ranks, or the ranks whose dumps hold it."""
    table = run.flight_recorder
    if table is None or table.empty:
        return [], {}
    dumped = flight_recorder_ranks(run)  # a rank without a dump: unknown
    table = table[~table["p2p"].astype(bool)]
    done: dict[tuple[int, str], int] = {}
    issued: list[Issued] = []
    for group, rows in table.groupby("group", sort=True):
        last = rows.groupby("rank")["seq"].max()
        known = next((m for m in rows["members"] if isinstance(m, tuple) and m), None)
        members = tuple(sorted(known or {int(r) for r in last.index}))
        for rank, seq in last.items():
            done[(int(rank), str(group))] = int(seq)
        behind = [m for m in members if m in dumped and int(last.get(m, 0)) < int(last.max())]
        if behind:
            first = min(int(last.get(m, 0)) for m in behind) + 1
            at = rows[rows["seq"] == first]
        else:
            at = rows[rows["open"].astype(bool)]
        for row in at.head(MAX_OPEN_PER_RANK * 64).itertuples():
            issued.append(Issued(int(row.rank), str(group), int(row.seq), str(row.op),
                                 as_int(row.bytes), as_text(row.dtype), None,
                                 as_int(row.t_created_ns), members, "flight recorder",
                                 seen_ns=as_int(row.dumped_ns)))  # fmt: skip
            done[(int(row.rank), str(group))] = int(row.seq) - 1  # in it, not past it
    return issued, done


def members_of(issued: list[Issued], run: RunData, world: int) -> list[int] | None:
    """The ranks that should join the collective the `issued` ranks wait in: the record's
    group ranks, else the manifest's group of that name that holds every waiting rank, else
    the world for a group of the world's size; None when the records cannot tell."""
    for one in issued:
        if one.members:
            return list(one.members)
    waiting = {i.rank for i in issued}
    for members in run.manifest.groups.get(issued[0].group, []):
        if waiting <= set(members):
            return sorted(members)
    if any(one.group_size == world for one in issued):
        return list(range(world))
    return None


def stuck_collectives(
    issued: list[Issued],
    ranks: dict[int, RankRecords],
    run: RunData,
    done: dict[tuple[int, str], int],
    window_s: float,
    seen: set[int] | None = None,
) -> list[Stuck]:
    """The collectives ranks wait in, oldest first: who waits, who never joined, and the
    waiting ranks whose op, size or dtype differs from the most common one (a desync).
    `seen`: the ranks the source shows (their dump, their rank file; None: every rank). A
    member it does not show never joined only where no member it shows is behind: a job torn
    down after one rank failed leaves some ranks without a dump, wherever they were."""
    by_key: dict[tuple[str, int], list[Issued]] = {}
    for one in issued:
        if one.peer is None:
            by_key.setdefault((one.group, one.seq), []).append(one)
    found = stuck_p2p([one for one in issued if one.peer is not None], ranks, window_s, seen)
    for (group, seq), waiting in by_key.items():
        members = members_of(waiting, run, len(ranks))
        present = {w.rank for w in waiting}
        absent = [m for m in (members or []) if m not in present]
        unseen = [] if seen is None else [m for m in absent if m not in seen]
        shown = [m for m in absent if m not in unseen]
        missing = [m for m in shown if done_upto(ranks, done, m, group) < seq]
        # a collective waited in lacks some member: the ones shown behind it, else (every
        # shown member waits in it) the unseen ones, by elimination
        missing = _stopped_first(missing, waiting, ranks) if shown else unseen
        # members that completed this sequence number did so with their own op: a rank that
        # broadcast where the others all-reduce passed through, and left them waiting
        waited = {w.rank: waited_s(w, ranks) for w in waiting}
        longest = max((s for s in waited.values() if s is not None), default=None)
        if (
            longest is not None and longest < window_s and not missing and window_s > 0
            and not any(ended(ranks, w.rank) for w in waiting)
        ):  # fmt: skip
            continue  # in flight for less than a few steps: a live job's ordinary state
        keys = [signature(w.op, w.bytes, w.dtype) for w in waiting]
        # the most common signature; a tie (two ranks) goes to the one the group's earlier
        # collectives had: the odd op out is the one this group does not usually issue
        history = [signature(*k) for w in waiting
                   for k in ranks[w.rank].done_ops.get(group, []) if w.rank in ranks]  # fmt: skip
        common = max(sorted(set(keys), key=str), key=lambda k: (keys.count(k), history.count(k)))
        # members that completed this number did so with their own op (a rank that broadcast
        # where the others all-reduce went on, and left them waiting): the odd ones out
        passed = [p for m in (members or []) if m not in present and not done
                  and (p := passed_as(ranks, m, group, seq)) is not None
                  and signature(p.op, p.bytes, p.dtype) != common]  # fmt: skip
        mismatched = [mismatch(w, common) for w, k in zip(waiting, keys, strict=True)
                      if k != common] + [mismatch(p, common) for p in passed]  # fmt: skip
        first = next(w for w, k in zip(waiting, keys, strict=True) if k == common)
        # fewer ranks wait in it than never joined, and every one that never joined waits in
        # an op of its own: the waiting ranks issued a collective the others never issued (a
        # desync), not the others stuck before it
        elsewhere = [ranks[m].issued for m in missing if m in ranks]
        if (
            missing
            and len(waiting) < len(missing)
            and len(elsewhere) == len(missing)
            and all(elsewhere)
        ):
            theirs = elsewhere[0][0]
            mismatched += [
                {"class": "a collective the others never issued", "rank": w.rank, "op": w.op,
                 "bytes": w.bytes, "dtype": w.dtype,
                 "expected": {"op": theirs.op, "bytes": theirs.bytes, "dtype": theirs.dtype}}
                for w in waiting
            ]  # fmt: skip
            missing = []
        found.append(Stuck(group, seq, first.op, first.bytes, first.dtype,
                           min((w.step for w in waiting if w.step is not None), default=None),
                           sorted(present), missing, members, waited, mismatched,
                           first.source, unseen))  # fmt: skip
    return sorted(found, key=lambda s: (-len(s.missing), -longest_wait_s(s), s.group, s.seq))


def _stopped_first(
    missing: list[int], waiting: list[Issued], ranks: dict[int, RankRecords]
) -> list[int]:
    """Of the members that never joined, those that stopped: a member still making progress
    after the first rank began to wait was behind, on its way (the job ended before it got
    there), not stuck, where another member's progress had stopped before the wait began."""
    began = min((w.t0_ns for w in waiting if w.t0_ns is not None), default=None)
    if began is None or len(missing) < 2:
        return missing

    def moving(rank: int) -> bool:
        progress = ranks[rank].last_progress_ns if rank in ranks else None
        return progress is not None and progress > began

    stopped = [m for m in missing if not moving(m)]
    return stopped or missing


def stuck_p2p(
    issued: list[Issued],
    ranks: dict[int, RankRecords],
    window_s: float,
    seen: set[int] | None = None,
) -> list[Stuck]:
    """Sends and recvs ranks wait in. Their sequence numbers count each rank's own ops on the
    group, so they do not pair across ranks: the op waits for its peer, and the peer never
    joined when it waits in no op at all (one waiting in an op of its own is a link of the
    chain that leads to the rank that never joined, not the cause); a peer the source does
    not show (`seen`) is named so by elimination, as `stuck_collectives` says."""
    waiting_ranks = {one.rank for one in issued} | {
        r for r, info in ranks.items() if any(i.peer is None for i in info.issued)
    }
    found = []
    for one in issued:
        assert one.peer is not None
        waited = {one.rank: waited_s(one, ranks)}
        missing = [] if one.peer in waiting_ranks else [one.peer]
        longest = waited[one.rank]
        if (
            longest is not None and longest < window_s and not missing and window_s > 0
            and not ended(ranks, one.rank)
        ):  # fmt: skip
            continue  # in flight for less than a few steps: a live job's ordinary state
        unseen = [one.peer] if seen is not None and one.peer not in seen else []
        found.append(Stuck(one.group, one.seq, one.op, one.bytes, one.dtype, one.step,
                           [one.rank], missing, sorted({one.rank, one.peer}), waited, [],
                           one.source, unseen))  # fmt: skip
    return found


def ended(ranks: dict[int, RankRecords], rank: int) -> bool:
    """Whether `rank` raised or closed: a collective it was left in will never complete,
    however short its wait (a group timeout shorter than the window ends it early)."""
    info = ranks.get(rank)
    return info is not None and (info.exception is not None or info.closed is not None)


def passed_as(ranks: dict[int, RankRecords], rank: int, group: str, seq: int) -> Issued | None:
    """The collective `rank` completed as number `seq` of `group`, when its records keep it."""
    info = ranks.get(rank)
    if info is None:
        return None
    kept = info.done_ops.get(group, [])
    index = seq - 1 - (info.done.get(group, 0) - len(kept))
    if not 0 <= index < len(kept):
        return None
    op, size, dtype = kept[index]
    return Issued(rank, group, seq, op, as_int(size) if pd.notna(size) else None, dtype, None,
                  None, None, "completed")  # fmt: skip


def done_upto(
    ranks: dict[int, RankRecords], done: dict[tuple[int, str], int], rank: int, group: str
) -> int:
    if done:
        return done.get((rank, group), 0)
    info = ranks.get(rank)
    return info.done.get(group, 0) if info is not None else 0


def longest_wait_s(stuck: Stuck) -> float:
    return max((s for s in stuck.waited_s.values() if s is not None), default=0.0)


def signature(op: Any, size: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """What must match across the ranks of one collective: op, dtype and, where every member
    passes the same size, the size; nothing for point-to-point ops (a send meets a receive)."""
    name = str(op)
    if name in P2P_OPS:
        return ("p2p", None, None)
    return (name, size if name in SAME_SIZE_OPS else None, dtype)


def mismatch_kind(key: tuple[Any, Any, Any], common: tuple[Any, Any, Any]) -> str:
    """What differs first between two signatures: the op (`type`), the size or the dtype."""
    return "type" if key[0] != common[0] else "size" if key[1] != common[1] else "dtype"


def mismatch(one: Issued, common: tuple[Any, Any, Any]) -> dict[str, Any]:
    mine = signature(one.op, one.bytes, one.dtype)
    return {"class": f"{mismatch_kind(mine, common)} mismatch", "rank": one.rank, "op": one.op,
            "bytes": one.bytes, "dtype": one.dtype,
            "expected": {"op": common[0], "bytes": common[1], "dtype": common[2]}}  # fmt: skip


def waited_s(one: Issued, ranks: dict[int, RankRecords]) -> float | None:
    """From the collective's issue to the last time its rank was known alive (its records, or
    without them the time of its Flight Recorder dump)."""
    alive = ranks[one.rank].last_alive_ns if one.rank in ranks else None
    alive = one.seen_ns if alive is None else alive
    if one.t0_ns is None or alive is None or alive < one.t0_ns:
        return None
    return (alive - one.t0_ns) / NS_PER_S
