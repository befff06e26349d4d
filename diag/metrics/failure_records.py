"""What each rank's records say, gathered once for the failure analysis (diag/metrics/failure.py):
its last progress (step, span and comm records), what its last flush left open (`span_open`,
`comm_issued`, `step_open` events not superseded by a completed record), when it was last alive
(its heartbeats and other events), its `stall`, `exception` and `rank_closed` events, its
completed collectives per group; and the shapes the analysis hands on (`Issued`, `Stuck`,
`RankWhere`, `RunState`: derived results, not records of the run directory's contract).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diag.contract.limits import MAX_LABEL_CHARS, MAX_WORLD_SIZE
from diag.read.load import RunData

STATUSES = ("completed", "failed", "hung", "running", "undecidable")
MAX_OPEN_PER_RANK = 256
"""Open collectives kept per rank (a flush writes the few in flight; more is corrupt input)."""
DESYNC_TAIL = 256
"""Completed collectives compared per rank and group, from the end (a desync shows last)."""
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
    unseen: list[int] = field(default_factory=list)
    """Members that left no evidence (no dump, no rank file) and did not wait in it: named in
    `missing` only when no member that left evidence is behind (the wait must be theirs), else
    unknown (whether they joined, nothing says)."""

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
    died_why: str = ""
    """Why lost ranks died rather than hung, where the waiters' timeouts say it (failure.py)."""
    behind: list[int] = field(default_factory=list)
    """Ranks that neither raised nor closed, whose progress stopped before that of every rank
    that raised (records without in-flight state): the others went on, waited for them and
    raised; their exceptions are the timeouts that followed."""
    failed_step: int | None = None
    flight_recorder: list[Stuck] = field(default_factory=list)
    """The stuck collectives the Flight Recorder dumps show on their own (a second witness)."""
    notes: list[str] = field(default_factory=list)
    unrecorded: list[int] = field(default_factory=list)
    """Ranks of the world without a rank file: where they stopped no record says."""
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
class RankRecords:
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


def read_progress(run: RunData, ranks: dict[int, RankRecords]) -> None:
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


def read_events(run: RunData, ranks: dict[int, RankRecords]) -> None:
    """Each rank's open state (its last flush's, less what completed since), life signs."""
    events = run.events
    if events.empty or "fields" not in events:
        return
    wanted = events[events["name"].isin(OPEN_EVENTS | LIFE_EVENTS)]
    done_spans = record_keys(run.spans, ("rank", "step", "phase", "mb"))
    done_steps = record_keys(run.steps, ("rank", "step"))
    done_t0 = record_keys(run.comms, ("rank", "group", "t0"))
    seen_issued: dict[int, dict[tuple[str, int], Issued]] = {}
    for rank_, step_, name, fields in zip(
        wanted["rank"], wanted["step"], wanted["name"], wanted["fields"], strict=True
    ):
        rank, step = int(rank_), int(step_)
        info = ranks.get(rank)
        if info is None or not isinstance(fields, dict):
            continue
        t = as_int(fields.get("t_ns"))
        if t is None:
            t = as_int(fields.get("t0"))
        if t is not None and name in LIFE_EVENTS:
            info.last_alive_ns = max(t, info.last_alive_ns or t)
        if name == "heartbeat":
            info.heartbeat_s = max(info.heartbeat_s, as_float(fields.get("interval_s")) or 0.0)
        elif name == "stall":
            info.stall = {"step": step, **fields}
        elif name == "exception" and info.exception is None:
            info.exception = exception_of(step, fields)
        elif name == "signal":
            info.signal = as_text(fields.get("signal"))
        elif name == "rank_closed":
            info.closed = as_text(fields.get("status"))
        elif name == "step_open" and (rank, step) not in done_steps:
            info.open_steps.append(step)
        elif name == "span_open":
            key = (rank, step, str(fields.get("phase")), as_int(fields.get("mb")) or 0)
            if key not in done_spans:
                info.open_spans = [s for s in info.open_spans if s["key"] != key]
                info.open_spans.append({"key": key, "step": step, "phase": key[2], "t0": t})
        elif name == "comm_issued":
            issued = issued_from(rank, step, fields)
            if issued is None or (rank, issued.group, issued.t0_ns) in done_t0:
                continue
            if issued.seq <= info.done.get(issued.group, 0):
                continue  # completed since that flush
            mine = seen_issued.setdefault(rank, {})
            if len(mine) < MAX_OPEN_PER_RANK:
                mine[(issued.group, issued.seq)] = issued
    for rank, mine in seen_issued.items():
        ranks[rank].issued = list(mine.values())


def issued_from(rank: int, step: int, fields: dict[str, Any]) -> Issued | None:
    seq, group = as_int(fields.get("seq")), fields.get("group")
    if seq is None or group is None:
        return None
    members = fields.get("group_ranks")
    known = (
        tuple(sorted({int(m) for m in members}))
        if isinstance(members, list) and all(as_int(m) is not None for m in members)
        and len(members) <= MAX_WORLD_SIZE
        else None
    )  # fmt: skip
    if known is None and as_int(fields.get("peer")) is not None:
        known = tuple(sorted({rank, int(fields["peer"])}))
    return Issued(rank, as_text(group) or "?", seq, as_text(fields.get("op")) or "?",
                  as_int(fields.get("bytes")), as_text(fields.get("dtype")), step,
                  as_int(fields.get("t0")), known, "records",
                  as_int(fields.get("group_size")), peer=as_int(fields.get("peer")))  # fmt: skip


def record_keys(frame: pd.DataFrame, columns: Iterable[str]) -> set[tuple]:
    columns = list(columns)
    if frame.empty or any(c not in frame for c in columns):
        return set()
    values = [
        frame[c].astype(str) if c in ("phase", "group")
        else pd.to_numeric(frame[c], errors="coerce").fillna(0).astype("int64")  # mb: null = 0
        for c in columns
    ]  # fmt: skip
    return {tuple(key_value(v) for v in row) for row in zip(*values, strict=True)}


def key_value(value: Any) -> Any:
    return int(value) if isinstance(value, int | np.integer) else str(value)


def exception_of(step: int, fields: dict[str, Any]) -> dict[str, Any]:
    frames = fields.get("frames")
    frame = frame_text(frames[-1]) if isinstance(frames, list) and frames else None
    return {"step": step, "type": as_text(fields.get("type")),
            "message": (as_text(fields.get("message")) or "")[:2000], "frame": frame,
            "t_ns": as_int(fields.get("t_ns"))}  # fmt: skip


def frame_text(frame: Any) -> str | None:
    if not isinstance(frame, dict):
        return None
    return as_text(f"{frame.get('function')} ({frame.get('file')}:{frame.get('line')})")


def ranks_phrase(ranks: Iterable[int]) -> str:
    """`rank 2`, `ranks 0, 1, 3`."""
    listed = sorted(set(ranks))
    return f"rank{'s' if len(listed) != 1 else ''} {rank_list(listed)}"


def rank_list(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def as_text(value: Any) -> str | None:
    return None if value is None else str(value)[:MAX_LABEL_CHARS]


def as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return None
    return int(value) if abs(int(value)) < 2**62 else None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if np.isfinite(value) and 0 <= value < 1e6 else None
