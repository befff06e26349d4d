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
from typing import Any

import numpy as np
import pandas as pd

from diag.contract.limits import MAX_WORLD_SIZE
from diag.metrics.common import NS_PER_S
from diag.metrics.failure_desync import completed_desync, fr_desync, troubled
from diag.metrics.failure_records import (
    STATUSES,
    Issued,
    RankRecords,
    RankWhere,
    RunState,
    Stuck,
    as_int,
    frame_text,
    ranks_phrase,
    read_events,
    read_progress,
)
from diag.metrics.failure_stuck import (
    flight_recorder_issued,
    flight_recorder_ranks,
    longest_wait_s,
    stuck_collectives,
)
from diag.read.load import RunData

__all__ = ["STATUSES", "Issued", "RankWhere", "RunState", "Stuck", "run_state"]

WINDOW_STEPS = 3.0
"""A rank is silent, a collective stuck, a run no longer running after this many median steps
(plus WINDOW_FLOOR_S and the heartbeat period): a slow step is not a hang."""
WINDOW_FLOOR_S = 5.0
DEFAULT_STEP_S = 1.0
"""The median step of a run with no complete step (a Flight Recorder folder alone)."""


def run_state(run: RunData, now_s: float | None = None) -> RunState:
    """The run's status and, when it did not finish, where each rank stopped; `now_s` (the
    wall clock, default now) judges whether records still arrive (the rank files' times)."""
    now = time.time() if now_s is None else now_s
    world = min(int(run.manifest.world_size), MAX_WORLD_SIZE)
    median_s = _median_step_s(run.steps)
    ranks = {r: RankRecords() for r in range(world)}
    read_progress(run, ranks)
    read_events(run, ranks)
    heartbeat_s = max((r.heartbeat_s for r in ranks.values()), default=0.0)
    window_s = WINDOW_STEPS * median_s + WINDOW_FLOOR_S + heartbeat_s
    from_records = [i for r in ranks.values() for i in r.issued]
    fr_issued, fr_done = flight_recorder_issued(run)
    # while records arrive, a collective in flight for less than the window is ordinary;
    # once they stopped, whatever was left open never completed
    live_s = window_s if _arriving(run, now, window_s) else 0.0
    unrecorded = _unrecorded(run, ranks)
    recorded = {r for r in ranks if r not in unrecorded}
    stuck = stuck_collectives(from_records, ranks, run, {}, live_s, recorded)
    fr_stuck = (
        stuck_collectives(fr_issued, ranks, run, fr_done, live_s, flight_recorder_ranks(run))
        if fr_issued
        else []
    )
    if not from_records and fr_stuck:  # the records hold no open state: the dumps speak
        stuck = fr_stuck
    state = RunState("running", "", median_s, window_s, stuck=stuck, flight_recorder=fr_stuck,
                     unrecorded=unrecorded)  # fmt: skip
    state.desync = [
        *({"class": m["class"], "group": s.group, "seq": s.seq, "step": s.step, **m}
          for s in stuck for m in s.mismatched),
        # the completed collectives are compared only when the job shows trouble: a profiler
        # trace's window or a finished run may pair them in another order without harm
        *(completed_desync(run) if troubled(run, ranks, stuck) else []),
        *fr_desync(run),
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
    # and so is one raised in a collective a member of it had already left by raising: the
    # first to raise there is the candidate cause, the later ones waited for it
    for s in stuck:
        raised = sorted(
            (t, r) for r in s.waiting
            if (e := ranks[r].exception) is not None and (t := e.get("t_ns")) is not None
        )  # fmt: skip
        blocked |= {r for t, r in raised if t > raised[0][0]}
    state.crashed = sorted(
        ({"rank": r, **e} for r, info in ranks.items()
         if (e := info.exception) is not None and r not in blocked),
        key=lambda e: (e["t_ns"] is None, e["t_ns"] or 0, e["rank"]),
    )  # fmt: skip
    # (the first to raise comes first: the status names it)
    state.timed_out = [
        {"rank": r, **e} for r, info in ranks.items()
        if (e := info.exception) is not None and r in blocked
    ]  # fmt: skip
    state.behind = _behind(ranks, state.crashed, median_s)
    if state.behind:  # the raisers went on past them and waited: their timeouts, not crashes
        state.timed_out = sorted([*state.timed_out, *state.crashed], key=lambda e: e["rank"])
        state.crashed = []
    end_ns = max((r.last_alive_ns for r in ranks.values() if r.last_alive_ns), default=None)
    table = run.flight_recorder
    dumped = set() if table is None or table.empty else {int(r) for r in table["rank"].unique()}
    state.lost = _lost(ranks, stuck, end_ns, window_s, dumped)
    died, state.died_why = _died(ranks, stuck, table)
    state.lost += [r for r in died if r not in state.lost]
    timed_out = {row["rank"] for row in state.timed_out}
    state.ranks = [
        _where(r, info, stuck, state.lost, end_ns, r in timed_out, r in state.behind)
        for r, info in ranks.items()
    ]
    state.failed_step = _failed_step(state, ranks)
    state.status, state.reason = _status(run, ranks, state, now, window_s)
    return state


def _median_step_s(steps: pd.DataFrame) -> float:
    if steps.empty:
        return DEFAULT_STEP_S
    walls = (steps["t1"].to_numpy() - steps["t0"].to_numpy()) / NS_PER_S
    walls = walls[np.isfinite(walls) & (walls > 0)]
    return float(np.median(walls)) if len(walls) else DEFAULT_STEP_S


BEHIND_STEPS = 0.5
"""A rank is behind the ones that raised when its last progress precedes all of theirs by more
than this many median steps (ranks in one step finish its records close together)."""


def _behind(
    ranks: dict[int, RankRecords], crashed: list[dict[str, Any]], median_s: float
) -> list[int]:
    """Ranks that neither raised nor closed and stopped progressing before every rank that
    raised did (and before the first raise): with no in-flight record to say who waited for
    whom, the ranks that went on further and then raised waited for these. A rank that raised
    first, behind the others (a crash in its forward pass), leaves the others ahead: none."""
    if not crashed:
        return []
    raisers = {int(e["rank"]) for e in crashed}
    progress = [ranks[r].last_progress_ns for r in raisers]
    if any(p is None for p in progress):
        return []  # a rank raised before any progress: nothing to compare
    floor = min(p for p in progress if p is not None) - BEHIND_STEPS * median_s * NS_PER_S
    first_raise = min((t for e in crashed if (t := e.get("t_ns")) is not None), default=None)
    return [
        r for r, info in ranks.items()
        if r not in raisers and info.exception is None and info.closed is None
        and info.last_progress_ns is not None and info.last_progress_ns < floor
        and (first_raise is None or info.last_progress_ns < first_raise)
    ]  # fmt: skip


def _ended_by_launcher(ranks: dict[int, RankRecords]) -> list[int]:
    """Ranks that stopped silently (no exception, close or signal) before the others were
    ended: every other rank received a signal (the launcher ending the job: torchrun's SIGTERM
    when a rank exits), raised or closed, and at least one received a signal, after the
    silent rank's last record. A rank that aborted or was killed then took the job down, however
    short the time since (a launcher ends the rest at once, well inside the window)."""
    silent = [r for r, i in ranks.items()
              if i.exception is None and not i.closed and not i.signal
              and i.last_alive_ns is not None]  # fmt: skip
    others = [i for r, i in ranks.items() if r not in silent]
    if not silent or not others or not any(i.signal for i in others):
        return []
    if any(i.exception is None and not i.closed and not i.signal for i in others):
        return []  # a rank with no record at all: nothing says when it stopped
    first_end = min((i.last_alive_ns for i in others if i.last_alive_ns is not None), default=None)
    if first_end is None:
        return []
    return [r for r in silent if (ranks[r].last_alive_ns or 0) < first_end]


def _lost(
    ranks: dict[int, RankRecords],
    stuck: list[Stuck],
    end_ns: int | None,
    window_s: float,
    dumped: set[int] | frozenset[int] = frozenset(),
) -> list[int]:
    """Ranks whose records stop (no exception, no close) while others went on or waited for
    longer than the window: killed, or their node lost. `dumped`: the ranks that left a Flight
    Recorder dump (a live process writes it)."""
    # a rank that recorded the launcher's signal shows a collector that writes signs of life as
    # well as a heartbeat does: whether a heartbeat reached the disk before a rank died in the
    # job's first seconds is timing (a loaded host delays the first), not evidence
    if end_ns is None or not any(
        i.heartbeat_s or i.closed or i.stall or i.signal for i in ranks.values()
    ):
        return []  # no rank writes signs of life (older collectors, traces): silence means nothing
    waiting = {r for s in stuck for r in s.waiting}
    ended = _ended_by_launcher(ranks)
    # a silent rank that waits in a collective another member never joined waited for that
    # member: its SIGTERM record lost to a flush cut short (a loaded host), it is the victim;
    # the member that never joined is lost (unless the waiters are all there is)
    victims = {r for s in stuck if s.missing for r in s.waiting}
    ended = [r for r in ended if r not in victims] or ended
    # so is one whose records stop as early but that lived to dump its Flight Recorder (the
    # launcher's SIGTERM reached it): a killed process leaves no dump
    ended = [r for r in ended if r not in dumped] or ended
    if ended:  # the job was ended: the rank that stopped silently before that is lost
        return sorted(ended, key=lambda r: (ranks[r].last_alive_ns or 0, r))  # the first first
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


EARLY_SHARE = 0.5
"""A rank that raised in a collective before this share of its timeout had run did not time
out: the transport to a missing member broke (its process died)."""


def _died(
    ranks: dict[int, RankRecords], stuck: list[Stuck], table: pd.DataFrame | None
) -> tuple[list[int], str]:
    """Silent ranks (no exception, close or signal) missing from a collective that every
    waiting member left by raising long before its timeout: a hung member lets the waiters'
    timeout run out (they raise at it); one whose process died closes its connections, and
    they raise at once (gloo's "Connection reset by peer", NCCL's "remote process exited").
    The timeout is the Flight Recorder's (`timeout_ms` of the waiting rank's entries); without
    a dump it is unknown, and so is this."""
    if table is None or table.empty or "timeout_ms" not in table:
        return [], ""
    timeouts = table.dropna(subset=["timeout_ms"]).groupby("rank")["timeout_ms"].max()
    died: list[int] = []
    why = ""
    for s in stuck:
        if not s.missing or not s.waiting:
            continue
        early = [
            r for r in s.waiting
            if ranks[r].exception is not None and (waited := s.waited_s.get(r)) is not None
            and r in timeouts.index and waited < EARLY_SHARE * float(timeouts[r]) / 1e3
        ]  # fmt: skip
        if len(early) < len(s.waiting):
            continue  # a waiter that did not raise, or raised at its timeout: a hang
        gone = [r for r in s.missing if r in ranks and _silent(ranks[r]) and r not in died]
        if gone and not why:
            waited = max(s.waited_s[r] or 0.0 for r in early)
            why = (
                f"{ranks_phrase(early)} raised in {s.label()} after {waited:.3g} s of a "
                f"{float(timeouts[early[0]]) / 1e3:.3g} s timeout (a hang lets it run out)"
            )
        died += gone
    return died, why


def _silent(info: RankRecords) -> bool:
    return info.exception is None and not info.closed and not info.signal


def _where(
    rank: int,
    info: RankRecords,
    stuck: list[Stuck],
    lost: list[int],
    end_ns: int | None,
    timed_out: bool,
    behind: bool = False,
) -> RankWhere:
    """Where `rank` stopped; `timed_out`: its exception was raised waiting for a peer;
    `behind`: it stopped progressing before the ranks that raised (`_behind`)."""
    waiting = [s for s in stuck if rank in s.waiting]
    missing = [s for s in stuck if rank in s.missing]
    stall = info.stall or {}
    stack = stall.get("stack")
    top = frame_text(stack[-1]) if isinstance(stack, list) and stack else None
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
    state = (
        "timed out" if timed_out
        else "crashed" if info.exception is not None
        else "completed" if info.closed == "complete"
        else "failed" if info.closed == "failed"
        else "silent" if rank in lost
        else "waiting" if waiting
        else "stalled" if missing or info.stall or behind
        else "stopped" if info.last_alive_ns is None
        else "running"
    )  # fmt: skip
    return RankWhere(rank, state, step, span, collective, waited, top, info.exception,
                     silent if rank in lost else None, info.closed)  # fmt: skip


def _failed_step(state: RunState, ranks: dict[int, RankRecords]) -> int | None:
    culprits = {r["rank"] for r in state.crashed} | set(state.lost) | set(state.behind)
    culprits |= {r for s in state.stuck for r in s.missing}
    culprits |= {d["rank"] for d in state.desync}
    steps = [w.step for w in state.ranks if w.rank in culprits and w.step is not None]
    if not steps:
        steps = [s.step for s in state.stuck if s.step is not None]
    return min(steps) if steps else None


def _unrecorded(run: RunData, ranks: dict[int, RankRecords]) -> list[int]:
    """The ranks of the world without a rank file, or without a trace in a trace folder
    (missing, not analysed): their silence says nothing of where they stopped. None for
    Flight Recorder dumps alone (failure_stuck.py reads which ranks dumped)."""
    if run.file_mtimes_s:
        shown = set(run.file_mtimes_s)
    elif run.flight_recorder is None and run.manifest.ranks:
        shown = {info.rank for info in run.manifest.ranks}  # the traced ranks
    else:
        return []
    return sorted(r for r in ranks if r not in shown)


def _status(
    run: RunData, ranks: dict[int, RankRecords], state: RunState, now_s: float, window_s: float
) -> tuple[str, str]:
    """The status and why (module docstring; docs/metrics.md)."""
    unrecorded = state.unrecorded
    closed = {r: i.closed for r, i in ranks.items() if r not in unrecorded}
    if state.crashed:
        first = state.crashed[0]
        return "failed", (f"rank {first['rank']} raised {first.get('type')} at step "
                          f"{first.get('step')}")  # fmt: skip
    failed_close = [r for r, c in closed.items() if c == "failed"]
    if closed and all(c == "complete" for c in closed.values()):
        if unrecorded:  # they took part in the collectives the others completed
            return "completed", (f"every rank with records closed complete; "
                                 f"{ranks_phrase(unrecorded)} left no records")  # fmt: skip
        return "completed", "every rank closed complete"
    signalled = [r for r, i in ranks.items() if i.signal]
    arriving = _arriving(run, now_s, window_s)
    never_closed = all(c is None for c in closed.values())
    hang = [s for s in state.stuck if s.missing or longest_wait_s(s) >= window_s]
    stalls = [r for r, i in ranks.items() if i.stall is not None and not _progress_after(i)]
    if state.lost and state.died_why:
        return "failed", f"{ranks_phrase(state.lost)} died: {state.died_why}"
    if state.lost:
        return "failed", (f"{ranks_phrase(state.lost)}: records stop with no exception and no "
                          "close while others went on")  # fmt: skip
    if state.behind:
        behind = state.behind
        steps = sorted({n for r in behind if (n := ranks[r].last_step) is not None})
        at = f" after step {steps[0]}" if len(steps) == 1 else ""
        alive = any((ranks[r].last_alive_ns or 0) > (ranks[r].last_progress_ns or 0)
                    for r in behind)  # fmt: skip
        raisers = ranks_phrase(e["rank"] for e in state.timed_out)
        return "hung" if alive else "failed", (
            f"{ranks_phrase(behind)} stopped making progress{at} while {raisers} went on, "
            "waited and raised (their timeouts)"
        )
    if state.desync:
        d = state.desync[0]
        return "hung" if hang else "failed", (
            f"desync: rank {d['rank']}, {d['class']} at #{d['seq']} of {d['group']}"
        )
    if hang:
        s = hang[0]
        who = f"{ranks_phrase(s.missing)} never joined" if s.missing else "no rank completed"
        if s.missing and set(s.missing) <= set(unrecorded):  # hung, crashed or died: unsaid
            who = f"{ranks_phrase(s.missing)}, which left no records, never joined"
        return "hung", f"{who} {s.label()}" + ("" if s.step is None else f" (step {s.step})")
    if stalls:
        return "hung", f"{ranks_phrase(stalls)} made no progress (stall event)"
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
                                   f"{ranks_phrase(absent)} left no dump")  # fmt: skip
        state.suspect = False  # the dumps agree: no failure shown (nor a completion)
        return "undecidable", "Flight Recorder dumps alone agree: nothing left open on any rank"
    last = [i.last_step for i in ranks.values() if i.last_step is not None]
    where = f"at step {max(last)}" if last else "before any step"
    recorded = (r for r in ranks if r not in unrecorded)
    behind = sorted(r for r in recorded if last and (ranks[r].last_step or -1) < max(last))
    if behind:  # some ranks stop steps before the others: where the job went wrong, unsaid
        stops = ", ".join(f"rank {r} at step {ranks[r].last_step}" for r in behind[:8])
        more = f" and {len(behind) - 8} more" if len(behind) > 8 else ""
        return "undecidable", (
            f"{ranks_phrase(behind)} stop{'s' if len(behind) == 1 else ''} before the others "
            f"({stops}{more}; the others {where}) with nothing open, no exception and no "
            "close: hung, died or cut short, which the records cannot tell apart"
        )
    return "undecidable", (f"the records stop {where} with nothing open, no exception and no "
                           "close: killed with the whole job, or written by a collector that "
                           "does not close")  # fmt: skip


def _progress_after(info: RankRecords) -> bool:
    stall_t = as_int((info.stall or {}).get("t_ns"))
    return stall_t is not None and (info.last_progress_ns or 0) > stall_t


def _arriving(run: RunData, now_s: float, window_s: float) -> bool:
    """Whether a rank file changed within the window (the wall clock; heartbeats count)."""
    times = list(run.file_mtimes_s.values())
    return bool(times) and now_s - max(times) < window_s
