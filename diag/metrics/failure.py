"""Whether the job finished, and where each rank stopped when it did not (docs/metrics.md,
"Status and failure").

Derived from what the records mean, never from a label we write: each rank's last progress
(step, span and comm records), what its last flush left open (`span_open`, `comm_issued`,
`step_open` events not superseded by a completed record), when it was last alive (its
heartbeats and other events), its `stall`, `exception` and `rank_closed` events, and the Flight
Recorder dumps read beside the run (`RunData.flight_recorder`). A collective is identified by
its group and its sequence number in that group; the ranks that should join it are its group's
members (the record's `group_ranks`, the manifest's group that holds the waiting ranks, the
world for a group of its size, the dump's `pg_config`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag.contract.limits import MAX_LABEL_CHARS, MAX_WORLD_SIZE
from diag.metrics.common import NS_PER_S
from diag.read.load import RunData

STATUSES = ("completed", "failed", "hung", "running", "undecidable")
WINDOW_STEPS = 3.0
"""A rank is silent, a collective stuck, a run no longer running after this many median steps
(plus WINDOW_FLOOR_S and the heartbeat period): a slow step is not a hang."""
WINDOW_FLOOR_S = 5.0
DEFAULT_STEP_S = 1.0
"""The median step of a run with no complete step (a Flight Recorder folder alone)."""
MAX_OPEN_PER_RANK = 256
"""Open collectives kept per rank (a flush writes the few in flight; more is corrupt input)."""
DESYNC_TAIL = 256
"""Completed collectives compared per rank and group, from the end (a desync shows last)."""
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv", "sendrecv"})
"""Point-to-point ops: a send pairs with a receive, so their op and place differ by design."""
SAME_SIZE_OPS = frozenset({"all_reduce", "allreduce", "broadcast", "reduce", "barrier"})
"""Collectives whose every member passes the same size; the others (all-to-all, uneven
gathers and scatters) may legitimately differ, and are compared by op and dtype only."""
OPEN_EVENTS = frozenset({"span_open", "comm_issued", "step_open"})
LIFE_EVENTS = frozenset({"heartbeat", "stall", "exception", "signal", "rank_closed"})


@dataclass
class Issued:
    """One rank's collective issued and not completed."""

    rank: int
    group: str
    seq: int
    op: str
    bytes: int | None
    dtype: str | None
    step: int | None
    t0_ns: int | None
    members: tuple[int, ...] | None
    source: str  # "records" | "flight recorder"
    group_size: int | None = None
    seen_ns: int | None = None
    """When it was last seen open without the rank's records: its Flight Recorder dump's time."""
    peer: int | None = None
    """The other rank (global) of a send or recv."""


@dataclass
class Stuck:
    """A collective (group, seq) that some ranks wait in: who waits, who never joined."""

    group: str
    seq: int
    op: str
    bytes: int | None
    dtype: str | None
    step: int | None
    waiting: list[int]
    missing: list[int]
    members: list[int] | None
    waited_s: dict[int, float | None]
    mismatched: list[dict[str, Any]]
    source: str

    def label(self) -> str:
        """`all_reduce #41 of dp`."""
        return f"{self.op} #{self.seq} of {self.group}"


@dataclass
class RankWhere:
    """Where one rank stopped: its state, its step, span and collective, how long it waited,
    the top of its stack (its `stall` event), its exception, how long it was silent."""

    rank: int
    state: str  # completed | running | waiting | stalled | crashed | failed | silent | stopped
    step: int | None
    span: str | None
    collective: str | None
    waited_s: float | None
    stack_top: str | None
    exception: dict[str, Any] | None = None
    silent_s: float | None = None
    closed: str | None = None


@dataclass
class RunState:
    """The run's status (STATUSES) with its reason, and the failure's evidence."""

    status: str
    reason: str
    median_step_s: float
    window_s: float
    ranks: list[RankWhere] = field(default_factory=list)
    stuck: list[Stuck] = field(default_factory=list)
    desync: list[dict[str, Any]] = field(default_factory=list)
    crashed: list[dict[str, Any]] = field(default_factory=list)
    timed_out: list[dict[str, Any]] = field(default_factory=list)
    """Exceptions raised while waiting in a collective another rank never joined or joined
    differently (the process group's timeout): consequences, not the cause."""
    lost: list[int] = field(default_factory=list)
    failed_step: int | None = None
    flight_recorder: list[Stuck] = field(default_factory=list)
    """The stuck collectives the Flight Recorder dumps show on their own (a second witness)."""
    notes: list[str] = field(default_factory=list)
    suspect: bool = True
    """For an undecidable run: whether its records look like a failure (they stop without a
    close) rather than simply not saying (Flight Recorder dumps alone that agree)."""

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "hung", "undecidable")

    def to_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["ranks"] = [asdict(r) for r in self.ranks]
        return found


@dataclass
class _Rank:
    """What one rank's records say, gathered once."""

    last_step: int | None = None
    last_progress_ns: int | None = None
    last_alive_ns: int | None = None
    last_span: tuple[int, str] | None = None
    open_spans: list[dict[str, Any]] = field(default_factory=list)
    open_steps: list[int] = field(default_factory=list)
    issued: list[Issued] = field(default_factory=list)
    stall: dict[str, Any] | None = None
    exception: dict[str, Any] | None = None
    closed: str | None = None
    signal: str | None = None
    heartbeat_s: float = 0.0
    done: dict[str, int] = field(default_factory=dict)  # completed collectives per group
    done_ops: dict[str, list[tuple[Any, Any, Any]]] = field(default_factory=dict)
    """The last DESYNC_TAIL completed collectives per group: (op, bytes, dtype) in order."""


def run_state(run: RunData, now_s: float | None = None) -> RunState:
    """The run's status and, when it did not finish, where each rank stopped; `now_s` (the
    wall clock, default now) judges whether records still arrive (the rank files' times)."""
    now = time.time() if now_s is None else now_s
    world = min(int(run.manifest.world_size), MAX_WORLD_SIZE)
    median_s = _median_step_s(run.steps)
    ranks = {r: _Rank() for r in range(world)}
    _progress(run, ranks)
    _events(run, ranks)
    heartbeat_s = max((r.heartbeat_s for r in ranks.values()), default=0.0)
    window_s = WINDOW_STEPS * median_s + WINDOW_FLOOR_S + heartbeat_s
    from_records = [i for r in ranks.values() for i in r.issued]
    fr_issued, fr_done = _flight_recorder(run)
    # while records arrive, a collective in flight for less than the window is ordinary;
    # once they stopped, whatever was left open never completed
    live_s = window_s if _arriving(run, now, window_s) else 0.0
    stuck = _stuck(from_records, ranks, run, {}, live_s)
    fr_stuck = _stuck(fr_issued, ranks, run, fr_done, live_s) if fr_issued else []
    if not from_records and fr_stuck:  # the records hold no open state: the dumps speak
        stuck = fr_stuck
    state = RunState("running", "", median_s, window_s, stuck=stuck, flight_recorder=fr_stuck)
    state.desync = [
        *({"class": m["class"], "group": s.group, "seq": s.seq, "step": s.step, **m}
          for s in stuck for m in s.mismatched),
        # the completed collectives are compared only when the job shows trouble: a profiler
        # trace's window or a finished run may pair them in another order without harm
        *(_completed_desync(run) if _troubled(run, ranks, stuck) else []),
        *_fr_desync(run),
    ]  # fmt: skip
    # an exception raised while waiting in a collective another rank never joined (or
    # joined with another op or size) is the timeout that follows, not the cause
    blocked = {r for s in stuck if s.missing or s.mismatched for r in s.waiting}
    # so is one raised while the rank still waited in an op of its own (a pipeline's recv from
    # the stage that never sent: point-to-point sequence numbers do not pair across ranks)
    # while some rank never joined a collective, or ranks issued different collectives at one
    # sequence (a desync: the op each rank waits in never matches)
    absent = {m for s in stuck for m in s.missing}
    if absent or state.desync:
        blocked |= {r for r, info in ranks.items() if info.issued}
    state.crashed = [
        {"rank": r, **e} for r, info in ranks.items()
        if (e := info.exception) is not None and r not in blocked
    ]  # fmt: skip
    state.timed_out = [
        {"rank": r, **e} for r, info in ranks.items()
        if (e := info.exception) is not None and r in blocked
    ]  # fmt: skip
    end_ns = max((r.last_alive_ns for r in ranks.values() if r.last_alive_ns), default=None)
    state.lost = _lost(ranks, stuck, end_ns, window_s)
    state.ranks = [_where(r, info, stuck, state.lost, end_ns) for r, info in ranks.items()]
    state.failed_step = _failed_step(state, ranks)
    state.status, state.reason = _status(run, ranks, state, now, window_s)
    return state


def _median_step_s(steps: pd.DataFrame) -> float:
    if steps.empty:
        return DEFAULT_STEP_S
    walls = (steps["t1"].to_numpy() - steps["t0"].to_numpy()) / NS_PER_S
    walls = walls[np.isfinite(walls) & (walls > 0)]
    return float(np.median(walls)) if len(walls) else DEFAULT_STEP_S


def _progress(run: RunData, ranks: dict[int, _Rank]) -> None:
    """Each rank's last completed step, span and time of progress; its completed collectives
    counted per group (their sequence numbers: the collector numbers them 1, 2, ... per group)."""
    for frame in (run.steps, run.spans, run.comms):
        if frame.empty:
            continue
        last = frame.groupby("rank")["t1"].max()
        for rank, t1 in last.items():
            info = ranks.get(int(rank))
            if info is not None:
                info.last_progress_ns = max(int(t1), info.last_progress_ns or int(t1))
    if not run.steps.empty:
        for rank, step in run.steps.groupby("rank")["step"].max().items():
            if int(rank) in ranks:
                ranks[int(rank)].last_step = int(step)
    if not run.spans.empty:
        ends = run.spans.sort_values("t1", kind="stable").groupby("rank").tail(1)
        for rank, step, phase in zip(ends["rank"], ends["step"], ends["phase"], strict=True):
            if int(rank) in ranks:
                ranks[int(rank)].last_span = (int(step), str(phase))
    if not run.comms.empty:
        ordered = run.comms.sort_values(["rank", "t0"], kind="stable")
        for (rank, group), rows in ordered.groupby(["rank", "group"], observed=True):
            if int(rank) in ranks:
                info = ranks[int(rank)]
                info.done[str(group)] = len(rows)
                tail = rows.tail(DESYNC_TAIL)
                info.done_ops[str(group)] = list(zip(
                    tail["op"].astype(str), tail["bytes"], tail["dtype"].astype(str),
                    strict=True))  # fmt: skip
    for info in ranks.values():
        info.last_alive_ns = info.last_progress_ns


def _events(run: RunData, ranks: dict[int, _Rank]) -> None:
    """Each rank's open state (its last flush's, less what completed since), life signs."""
    events = run.events
    if events.empty or "fields" not in events:
        return
    wanted = events[events["name"].isin(OPEN_EVENTS | LIFE_EVENTS)]
    done_spans = _keys(run.spans, ("rank", "step", "phase", "mb"))
    done_steps = _keys(run.steps, ("rank", "step"))
    done_t0 = _keys(run.comms, ("rank", "group", "t0"))
    seen_issued: dict[int, dict[tuple[str, int], Issued]] = {}
    for rank_, step_, name, fields in zip(
        wanted["rank"], wanted["step"], wanted["name"], wanted["fields"], strict=True
    ):
        rank, step = int(rank_), int(step_)
        info = ranks.get(rank)
        if info is None or not isinstance(fields, dict):
            continue
        t = _int(fields.get("t_ns"))
        if t is None:
            t = _int(fields.get("t0"))
        if t is not None and name in LIFE_EVENTS:
            info.last_alive_ns = max(t, info.last_alive_ns or t)
        if name == "heartbeat":
            info.heartbeat_s = max(info.heartbeat_s, _float(fields.get("interval_s")) or 0.0)
        elif name == "stall":
            info.stall = {"step": step, **fields}
        elif name == "exception" and info.exception is None:
            info.exception = _exception(step, fields)
        elif name == "signal":
            info.signal = _text(fields.get("signal"))
        elif name == "rank_closed":
            info.closed = _text(fields.get("status"))
        elif name == "step_open" and (rank, step) not in done_steps:
            info.open_steps.append(step)
        elif name == "span_open":
            key = (rank, step, str(fields.get("phase")), _int(fields.get("mb")) or 0)
            if key not in done_spans:
                info.open_spans = [s for s in info.open_spans if s["key"] != key]
                info.open_spans.append({"key": key, "step": step, "phase": key[2], "t0": t})
        elif name == "comm_issued":
            issued = _issued(rank, step, fields)
            if issued is None or (rank, issued.group, issued.t0_ns) in done_t0:
                continue
            if issued.seq <= info.done.get(issued.group, 0):
                continue  # completed since that flush
            mine = seen_issued.setdefault(rank, {})
            if len(mine) < MAX_OPEN_PER_RANK:
                mine[(issued.group, issued.seq)] = issued
    for rank, mine in seen_issued.items():
        ranks[rank].issued = list(mine.values())


def _issued(rank: int, step: int, fields: dict[str, Any]) -> Issued | None:
    seq, group = _int(fields.get("seq")), fields.get("group")
    if seq is None or group is None:
        return None
    members = fields.get("group_ranks")
    known = (
        tuple(sorted({int(m) for m in members}))
        if isinstance(members, list) and all(_int(m) is not None for m in members)
        and len(members) <= MAX_WORLD_SIZE
        else None
    )  # fmt: skip
    if known is None and _int(fields.get("peer")) is not None:
        known = tuple(sorted({rank, int(fields["peer"])}))
    return Issued(rank, _text(group) or "?", seq, _text(fields.get("op")) or "?",
                  _int(fields.get("bytes")), _text(fields.get("dtype")), step,
                  _int(fields.get("t0")), known, "records",
                  _int(fields.get("group_size")), peer=_int(fields.get("peer")))  # fmt: skip


def _flight_recorder(run: RunData) -> tuple[list[Issued], dict[tuple[int, str], int]]:
    """What the dumps say is in flight, as PyTorch's `fr_trace` reads them: per group, the
    first sequence number some members issued and others never reached (the members behind
    never joined it; gloo retires an entry that timed out, so an issued entry counts whatever
    its state), plus every entry still open; and each rank's last sequence number per group.
    A group's members are its `pg_config` ranks, or the ranks whose dumps hold it."""
    table = run.flight_recorder
    if table is None or table.empty:
        return [], {}
    dumped = {int(r) for r in table["rank"].unique()}  # a rank without a dump: unknown
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
                                 _int(row.bytes), _text(row.dtype), None,
                                 _int(row.t_created_ns), members, "flight recorder",
                                 seen_ns=_int(row.dumped_ns)))  # fmt: skip
            done[(int(row.rank), str(group))] = int(row.seq) - 1  # in it, not past it
    return issued, done


def _members(issued: list[Issued], run: RunData, world: int) -> list[int] | None:
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


def _stuck(
    issued: list[Issued],
    ranks: dict[int, _Rank],
    run: RunData,
    done: dict[tuple[int, str], int],
    window_s: float,
) -> list[Stuck]:
    """The collectives ranks wait in, oldest first: who waits, who never joined, and the
    waiting ranks whose op, size or dtype differs from the most common one (a desync)."""
    by_key: dict[tuple[str, int], list[Issued]] = {}
    for one in issued:
        if one.peer is None:
            by_key.setdefault((one.group, one.seq), []).append(one)
    found = _stuck_p2p([one for one in issued if one.peer is not None], ranks, window_s)
    for (group, seq), waiting in by_key.items():
        members = _members(waiting, run, len(ranks))
        present = {w.rank for w in waiting}
        missing = [
            m for m in (members or [])
            if m not in present and _done(ranks, done, m, group) < seq
        ]  # fmt: skip
        # members that completed this sequence number did so with their own op: a rank that
        # broadcast where the others all-reduce passed through, and left them waiting
        waited = {w.rank: _waited_s(w, ranks) for w in waiting}
        longest = max((s for s in waited.values() if s is not None), default=None)
        if longest is not None and longest < window_s and not missing and window_s > 0:
            continue  # in flight for less than a few steps: a live job's ordinary state
        keys = [_signature(w.op, w.bytes, w.dtype) for w in waiting]
        # the most common signature; a tie (two ranks) goes to the one the group's earlier
        # collectives had: the odd op out is the one this group does not usually issue
        history = [_signature(*k) for w in waiting
                   for k in ranks[w.rank].done_ops.get(group, []) if w.rank in ranks]  # fmt: skip
        common = max(sorted(set(keys), key=str), key=lambda k: (keys.count(k), history.count(k)))
        # members that completed this number did so with their own op (a rank that broadcast
        # where the others all-reduce went on, and left them waiting): the odd ones out
        passed = [p for m in (members or []) if m not in present and not done
                  and (p := _passed(ranks, m, group, seq)) is not None
                  and _signature(p.op, p.bytes, p.dtype) != common]  # fmt: skip
        mismatched = [_mismatch(w, common) for w, k in zip(waiting, keys, strict=True)
                      if k != common] + [_mismatch(p, common) for p in passed]  # fmt: skip
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
                           first.source))  # fmt: skip
    return sorted(found, key=lambda s: (-len(s.missing), -_longest(s), s.group, s.seq))


def _stuck_p2p(issued: list[Issued], ranks: dict[int, _Rank], window_s: float) -> list[Stuck]:
    """Sends and recvs ranks wait in. Their sequence numbers count each rank's own ops on the
    group, so they do not pair across ranks: the op waits for its peer, and the peer never
    joined when it waits in no op at all (one waiting in an op of its own is a link of the
    chain that leads to the rank that never joined, not the cause)."""
    waiting_ranks = {one.rank for one in issued} | {
        r for r, info in ranks.items() if any(i.peer is None for i in info.issued)
    }
    found = []
    for one in issued:
        assert one.peer is not None
        waited = {one.rank: _waited_s(one, ranks)}
        missing = [] if one.peer in waiting_ranks else [one.peer]
        longest = waited[one.rank]
        if longest is not None and longest < window_s and not missing and window_s > 0:
            continue  # in flight for less than a few steps: a live job's ordinary state
        found.append(Stuck(one.group, one.seq, one.op, one.bytes, one.dtype, one.step,
                           [one.rank], missing, sorted({one.rank, one.peer}), waited, [],
                           one.source))  # fmt: skip
    return found


def _passed(ranks: dict[int, _Rank], rank: int, group: str, seq: int) -> Issued | None:
    """The collective `rank` completed as number `seq` of `group`, when its records keep it."""
    info = ranks.get(rank)
    if info is None:
        return None
    kept = info.done_ops.get(group, [])
    index = seq - 1 - (info.done.get(group, 0) - len(kept))
    if not 0 <= index < len(kept):
        return None
    op, size, dtype = kept[index]
    return Issued(rank, group, seq, op, _int(size) if pd.notna(size) else None, dtype, None,
                  None, None, "completed")  # fmt: skip


def _done(ranks: dict[int, _Rank], done: dict[tuple[int, str], int], rank: int, group: str) -> int:
    if done:
        return done.get((rank, group), 0)
    info = ranks.get(rank)
    return info.done.get(group, 0) if info is not None else 0


def _longest(stuck: Stuck) -> float:
    return max((s for s in stuck.waited_s.values() if s is not None), default=0.0)


def _signature(op: Any, size: Any, dtype: Any) -> tuple[Any, Any, Any]:
    """What must match across the ranks of one collective: op, dtype and, where every member
    passes the same size, the size; nothing for point-to-point ops (a send meets a receive)."""
    name = str(op)
    if name in P2P_OPS:
        return ("p2p", None, None)
    return (name, size if name in SAME_SIZE_OPS else None, dtype)


def _mismatch(one: Issued, common: tuple[Any, Any, Any]) -> dict[str, Any]:
    mine = _signature(one.op, one.bytes, one.dtype)
    kind = "type" if mine[0] != common[0] else "size" if mine[1] != common[1] else "dtype"
    return {"class": f"{kind} mismatch", "rank": one.rank, "op": one.op, "bytes": one.bytes,
            "dtype": one.dtype, "expected": {"op": common[0], "bytes": common[1],
                                              "dtype": common[2]}}  # fmt: skip


def _waited_s(one: Issued, ranks: dict[int, _Rank]) -> float | None:
    """From the collective's issue to the last time its rank was known alive (its records, or
    without them the time of its Flight Recorder dump)."""
    alive = ranks[one.rank].last_alive_ns if one.rank in ranks else None
    alive = one.seen_ns if alive is None else alive
    if one.t0_ns is None or alive is None or alive < one.t0_ns:
        return None
    return (alive - one.t0_ns) / NS_PER_S


def _troubled(run: RunData, ranks: dict[int, _Rank], stuck: list[Stuck]) -> bool:
    """Whether the records show the job in trouble: a collective stuck, an exception or a
    stall, or a run that neither closed every rank nor says it completed."""
    if stuck or any(i.exception or i.stall for i in ranks.values()):
        return True
    closed = all(i.closed == "complete" for i in ranks.values())
    return not closed and run.manifest.status != "complete"


def _completed_desync(run: RunData) -> list[dict[str, Any]]:
    """Completed collectives of a manifest group whose op, bytes or dtype differ across its
    members at the same position (the k-th collective each issued on it), from the end."""
    comms = run.comms
    if comms.empty or not run.manifest.groups:
        return []
    found: list[dict[str, Any]] = []
    ordered = comms.sort_values(["rank", "t0"], kind="stable")
    for label, lists in run.manifest.groups.items():
        mine = ordered[ordered["group"].astype(str) == label]
        if mine.empty:
            continue
        per_rank = {int(r): f for r, f in mine.groupby("rank")}
        for members in lists:
            rows = [per_rank.get(m) for m in members]
            if len(members) < 2 or any(r is None for r in rows):
                continue
            common = min(len(r) for r in rows if r is not None)
            start = max(0, common - DESYNC_TAIL)
            keys = [
                [_signature(*k) for k in zip(r["op"].astype(str).iloc[start:common],
                                             r["bytes"].iloc[start:common],
                                             r["dtype"].astype(str).iloc[start:common],
                                             strict=True)]
                for r in rows if r is not None
            ]  # fmt: skip
            for k in range(common - start):
                at = [key[k] for key in keys]
                if len(set(at)) > 1:
                    found += _desync_at(label, start + k + 1, members, at, rows, k + start)
                    break
    return found


def _desync_at(label: str, seq: int, members: list[int], at: list[tuple], rows: list, index: int
               ) -> list[dict[str, Any]]:  # fmt: skip
    common = max(set(at), key=at.count)
    out = []
    for member, key, frame in zip(members, at, rows, strict=True):
        if key != common:
            kind = "type" if key[0] != common[0] else "size" if key[1] != common[1] else "dtype"
            out.append({"class": f"{kind} mismatch", "group": label, "seq": seq,
                        "step": int(frame["step"].iloc[index]), "rank": member, "op": key[0],
                        "bytes": _int(key[1]), "dtype": key[2],
                        "expected": {"op": common[0], "bytes": _int(common[1]),
                                     "dtype": common[2]}})  # fmt: skip
    return out


def _fr_desync(run: RunData) -> list[dict[str, Any]]:
    """Flight Recorder entries of one (group, seq) whose op, size or dtype differ across
    ranks (its analyser's classes: type, size and dtype mismatch)."""
    table = run.flight_recorder
    if table is None or table.empty:
        return []
    found: list[dict[str, Any]] = []
    table = table[~table["p2p"].astype(bool)]
    signatures = [
        _signature(*k) for k in zip(table["op"], table["sizes"], table["dtype"], strict=True)
    ]
    history = {  # per group, how often each signature occurs: a tie goes to the usual one
        group: [signatures[i] for i in rows]
        for group, rows in table.reset_index(drop=True).groupby("group").indices.items()
    }
    for (group, seq), rows in table.groupby(["group", "seq"], sort=True):
        keys = [_signature(*k) for k in zip(rows["op"], rows["sizes"], rows["dtype"], strict=True)]
        if len(set(keys)) < 2:
            continue
        usual = history.get(group, [])
        common = max(sorted(set(keys), key=str), key=lambda k: (keys.count(k), usual.count(k)))
        for rank, key in zip(rows["rank"], keys, strict=True):
            if key != common:
                kind = "type" if key[0] != common[0] else "size" if key[1] != common[1] else "dtype"
                found.append({"class": f"{kind} mismatch", "group": str(group), "seq": int(seq),
                              "step": None, "rank": int(rank), "op": key[0], "sizes": key[1],
                              "dtype": key[2], "source": "flight recorder",
                              "expected": {"op": common[0], "sizes": common[1],
                                           "dtype": common[2]}})  # fmt: skip
        if len(found) >= 64:
            break
    return found


def _lost(
    ranks: dict[int, _Rank], stuck: list[Stuck], end_ns: int | None, window_s: float
) -> list[int]:
    """Ranks whose records stop (no exception, no close) while others went on or waited for
    longer than the window: killed, or their node lost."""
    if end_ns is None or not any(i.heartbeat_s or i.closed or i.stall for i in ranks.values()):
        return []  # no rank writes signs of life (older collectors, traces): silence means nothing
    waiting = {r for s in stuck for r in s.waiting}
    lost = []
    for rank, info in ranks.items():
        if info.exception or info.closed or rank in waiting or info.last_alive_ns is None:
            continue  # a rank with no record at all is noted by the loader (its file missing)
        if (end_ns - info.last_alive_ns) / NS_PER_S > window_s:
            lost.append(rank)
    others_alive = any(
        info.last_alive_ns is not None and r not in lost for r, info in ranks.items()
    )
    return lost if others_alive else []


def _where(
    rank: int, info: _Rank, stuck: list[Stuck], lost: list[int], end_ns: int | None
) -> RankWhere:
    waiting = [s for s in stuck if rank in s.waiting]
    missing = [s for s in stuck if rank in s.missing]
    stall = info.stall or {}
    stack = stall.get("stack")
    top = _frame_text(stack[-1]) if isinstance(stack, list) and stack else None
    if info.exception is not None:
        top = top or info.exception.get("frame")
    open_span = info.open_spans[-1] if info.open_spans else None
    span = (
        f"{open_span['phase']} (open, step {open_span['step']})" if open_span
        else f"{info.last_span[1]} (step {info.last_span[0]}, done)" if info.last_span
        else None
    )  # fmt: skip
    step = (
        max(info.open_steps) if info.open_steps
        else open_span["step"] if open_span
        else info.last_step
    )  # fmt: skip
    collective, waited = None, None
    if waiting:
        s = waiting[0]
        collective, waited = s.label(), s.waited_s.get(rank)
    elif missing:
        collective = f"never joined {missing[0].label()}"
    silent = (
        (end_ns - info.last_alive_ns) / NS_PER_S
        if end_ns is not None and info.last_alive_ns is not None
        else None
    )
    timed_out = (
        info.exception is not None
        and bool(waiting)
        and any(s.missing or s.mismatched for s in waiting)
    )
    state = (
        "timed out" if timed_out
        else "crashed" if info.exception is not None
        else "completed" if info.closed == "complete"
        else "failed" if info.closed == "failed"
        else "silent" if rank in lost
        else "waiting" if waiting
        else "stalled" if missing or info.stall
        else "stopped" if info.last_alive_ns is None
        else "running"
    )  # fmt: skip
    return RankWhere(rank, state, step, span, collective, waited, top, info.exception,
                     silent if rank in lost else None, info.closed)  # fmt: skip


def _failed_step(state: RunState, ranks: dict[int, _Rank]) -> int | None:
    culprits = {r["rank"] for r in state.crashed} | set(state.lost)
    culprits |= {r for s in state.stuck for r in s.missing}
    culprits |= {d["rank"] for d in state.desync}
    steps = [w.step for w in state.ranks if w.rank in culprits and w.step is not None]
    if not steps:
        steps = [s.step for s in state.stuck if s.step is not None]
    return min(steps) if steps else None


def _status(
    run: RunData, ranks: dict[int, _Rank], state: RunState, now_s: float, window_s: float
) -> tuple[str, str]:
    """The status and why (module docstring; docs/metrics.md)."""
    closed = {r: i.closed for r, i in ranks.items()}
    if state.crashed:
        first = state.crashed[0]
        return "failed", (f"rank {first['rank']} raised {first.get('type')} at step "
                          f"{first.get('step')}")  # fmt: skip
    failed_close = [r for r, c in closed.items() if c == "failed"]
    if ranks and all(c == "complete" for c in closed.values()):
        return "completed", "every rank closed complete"
    signalled = [r for r, i in ranks.items() if i.signal]
    arriving = _arriving(run, now_s, window_s)
    never_closed = all(c is None for c in closed.values())
    hang = [s for s in state.stuck if s.missing or _longest(s) >= window_s]
    stalls = [r for r, i in ranks.items() if i.stall is not None and not _progress_after(i)]
    if state.lost:
        return "failed", (f"{_ranks(state.lost)}: records stop with no exception and no "
                          "close while others went on")  # fmt: skip
    if state.desync:
        d = state.desync[0]
        return "hung" if hang else "failed", (
            f"desync: rank {d['rank']}, {d['class']} at #{d['seq']} of {d['group']}"
        )
    if hang:
        s = hang[0]
        who = f"{_ranks(s.missing)} never joined" if s.missing else "no rank completed"
        return "hung", f"{who} {s.label()}" + ("" if s.step is None else f" (step {s.step})")
    if stalls:
        return "hung", f"{_ranks(stalls)} made no progress (stall event)"
    if failed_close:
        return "failed", f"rank {failed_close[0]} closed with status failed"
    if signalled:
        return "failed", f"rank {signalled[0]} received {ranks[signalled[0]].signal}"
    manifest_status = run.manifest.status
    if never_closed and manifest_status == "complete":  # a run written before rank_closed
        if run.manifest.trainer == "kineto":  # a trace folder: its reader's word
            return "completed", ("every traced rank's profiled window closed at the same step "
                                 "(traces cannot say the job finished)")  # fmt: skip
        return "completed", "the manifest says complete and nothing was left open"
    in_flight = any(
        i.heartbeat_s or i.closed or i.stall or i.open_spans or i.issued or i.open_steps
        for i in ranks.values()
    )
    if not in_flight and run.flight_recorder is None and manifest_status == "running":
        # a writer without in-flight records (older collectors, the simulator): its silence
        # says nothing, so the manifest's word stands
        return "running", "the manifest says running (no in-flight records to judge by)"
    if arriving:
        return "running", "records still arrive"
    if manifest_status == "failed":
        return "failed", "the manifest says failed (no record says where)"
    if not run.file_mtimes_s and run.flight_recorder is not None:
        dumped = set(run.flight_recorder["rank"].unique()) if len(run.flight_recorder) else set()
        absent = sorted(set(ranks) - {int(r) for r in dumped})
        if absent:
            return "undecidable", (f"Flight Recorder dumps alone, nothing left open, and "
                                   f"{_ranks(absent)} left no dump")  # fmt: skip
        state.suspect = False  # the dumps agree: no failure shown (nor a completion)
        return "undecidable", "Flight Recorder dumps alone agree: nothing left open on any rank"
    last = [i.last_step for i in ranks.values() if i.last_step is not None]
    where = f"at step {max(last)}" if last else "before any step"
    return "undecidable", (f"the records stop {where} with nothing open, no exception and no "
                           "close: killed with the whole job, or written by a collector that "
                           "does not close")  # fmt: skip


def _progress_after(info: _Rank) -> bool:
    stall_t = _int((info.stall or {}).get("t_ns"))
    return stall_t is not None and (info.last_progress_ns or 0) > stall_t


def _arriving(run: RunData, now_s: float, window_s: float) -> bool:
    """Whether a rank file changed within the window (the wall clock; heartbeats count)."""
    times = list(run.file_mtimes_s.values())
    return bool(times) and now_s - max(times) < window_s


def _keys(frame: pd.DataFrame, columns: Iterable[str]) -> set[tuple]:
    columns = list(columns)
    if frame.empty or any(c not in frame for c in columns):
        return set()
    values = [
        frame[c].astype(str) if c in ("phase", "group")
        else pd.to_numeric(frame[c], errors="coerce").fillna(0).astype("int64")  # mb: null = 0
        for c in columns
    ]  # fmt: skip
    return {tuple(_key_value(v) for v in row) for row in zip(*values, strict=True)}


def _key_value(value: Any) -> Any:
    return int(value) if isinstance(value, int | np.integer) else str(value)


def _exception(step: int, fields: dict[str, Any]) -> dict[str, Any]:
    frames = fields.get("frames")
    frame = _frame_text(frames[-1]) if isinstance(frames, list) and frames else None
    return {"step": step, "type": _text(fields.get("type")),
            "message": (_text(fields.get("message")) or "")[:2000], "frame": frame,
            "t_ns": _int(fields.get("t_ns"))}  # fmt: skip


def _frame_text(frame: Any) -> str | None:
    if not isinstance(frame, dict):
        return None
    return _text(f"{frame.get('function')} ({frame.get('file')}:{frame.get('line')})")


def _ranks(ranks: Iterable[int]) -> str:
    """`rank 2`, `ranks 0, 1, 3`."""
    listed = sorted(set(ranks))
    return f"rank{'s' if len(listed) != 1 else ''} {_list(listed)}"


def _list(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:MAX_LABEL_CHARS]


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    return int(value) if abs(int(value)) < 2**62 else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if np.isfinite(value) and 0 <= value < 1e6 else None
