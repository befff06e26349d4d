"""Failure rules: the job did not finish. Hangs, crashes, desynchronised collectives, a rank
lost without a word, and runs whose records cannot tell (diag/metrics/failure.py derives the
evidence; these rules word it). Every finding of this family ranks above every performance
finding (`diag.rules.engine.rank_findings`): a job that stopped is the diagnosis, its speed
before that is context."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from diag.metrics.failure import RankWhere, RunState, Stuck
from diag.outputs.units import num, ranks_phrase, size
from diag.rules.engine import Finding, RuleContext, rule

HANG, CRASH, DESYNC, LOST, UNDECIDABLE = "FLR001", "FLR002", "FLR003", "FLR004", "FLR005"


def _state(ctx: RuleContext) -> RunState | None:
    return ctx.metrics.failure


@rule(HANG, "failure.hang", None)
def hang(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """A collective some ranks never joined: the others wait in it until the timeout.

    Symptom:
        The job stops making progress; the ranks that did join a collective sit in it (their
        `comm_issued` record, or their Flight Recorder entry, stays open) until the process
        group's timeout ends the job.
    Likely cause:
        The missing ranks are stuck before the collective: a data loader that blocks, a
        deadlock, an endless loop, a collective on another group issued in a different
        order, or a rank that waits for input only some ranks get.
    Fix:
        Look where each missing rank stopped (step, open span, the stack of its `stall`
        event): that line is the hang. Make every rank issue the same collectives in the
        same order; set the process group's timeout low enough to fail fast.
    Evidence:
        The collective (group, sequence number, op, bytes), the ranks that waited in it and
        for how long, the ranks that never joined (members of the group with no open or
        completed entry for that sequence), and for each missing rank its step, span and
        stack. Waiting longer than 3 median steps + 5 s (and the heartbeat period) counts.
        A member that left no rank file or dump (`unseen`) is named only by elimination,
        where every member the data shows waits; beside one shown behind, it is said unknown.
    """
    state = _state(ctx)
    if state is None or state.status == "running":
        return
    for stuck in state.stuck:
        if not stuck.missing and _longest(stuck) < state.window_s:
            continue
        if stuck.mismatched and not stuck.missing:
            continue  # a desync (FLR003) is the finding
        where = {w.rank: w for w in state.ranks}
        missing = [where[r] for r in stuck.missing if r in where]
        # no evidence of a rank: its rank file (the records) or its dump (the dumps alone)
        evidence, one = (
            ("dump", "dump") if stuck.source == "flight recorder" else ("records", "record")
        )
        unrecorded = stuck.missing and set(stuck.missing) <= set(stuck.unseen)
        said = f", which left no {evidence}," if unrecorded else ""
        unknown = [r for r in stuck.unseen if r not in stuck.missing]
        title = (
            f"hang: {ranks_phrase(stuck.missing)}{said} never joined {_collective(stuck)}; "
            f"{ranks_phrase(stuck.waiting)} waited {_waited(stuck)} in it"
            if stuck.missing
            else f"hang: {ranks_phrase(stuck.waiting)} waited {_waited(stuck)} in "
            f"{_collective(stuck)}, which no rank completed"
        )
        if missing and (missing[0].step is not None or missing[0].span or missing[0].stack_top):
            title += f"; {_stopped(missing[0])}"
        if unrecorded:  # its records would say whether it hung, crashed or died
            who = "it" if len(stuck.missing) == 1 else "they"
            title += f"; whether {who} hung, crashed or died, no {one} says"
        if unknown:  # torn down with the job wherever they were: neither named nor cleared
            title += (f"; {ranks_phrase(unknown)} left no {evidence}: whether "
                      f"{'it' if len(unknown) == 1 else 'they'} joined, nothing says")  # fmt: skip
        yield Finding(
            severity="high",
            title=title,
            ranks=list(stuck.missing or stuck.waiting),
            evidence={"collective": _stuck_evidence(stuck),
                      "missing_ranks": [_where_evidence(w) for w in missing],
                      "flight_recorder": [_stuck_evidence(s) for s in state.flight_recorder]},
            advice="see where each missing rank stopped (its step, open span and stack): that "
            "line blocks; every rank must issue the same collectives in the same order",
        )  # fmt: skip
    if state.behind:  # records without in-flight state: who stopped first, not the collective
        where = {w.rank: w for w in state.ranks}
        behind = [where[r] for r in state.behind if r in where]
        raisers = sorted(e["rank"] for e in state.timed_out)
        yield Finding(
            severity="high",
            title="hang: "
            + (_stopped(behind[0]) if len(behind) == 1 else f"{ranks_phrase(state.behind)} "
               "stopped")
            + f", making no progress while {ranks_phrase(raisers)} went on, waited and raised: "
            "their exceptions are the timeouts that followed (no in-flight record names the "
            "collective)",
            ranks=list(state.behind),
            evidence={"behind_ranks": [_where_evidence(w) for w in behind],
                      "timed_out_ranks": raisers},
            advice="see where each named rank stopped (its step, span and stack): that line "
            "blocks; record in-flight collectives (docs/collectors.md) or dump the Flight "
            "Recorder to name the collective",
        )  # fmt: skip


@rule(CRASH, "failure.crash", None)
def crash(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """A rank raised an exception out of the training loop; the others were left waiting.

    Symptom:
        One rank's process died with a traceback; the others stopped in the next collective
        and later failed with the process group's timeout (their tracebacks name the
        collective, not the cause).
    Likely cause:
        The exception of the first rank that raised: its type, message and innermost frame
        (an out-of-memory error, bad data, a bug on one rank's code path).
    Fix:
        Fix the exception the crashed rank raised (its frame is given); the timeouts of the
        other ranks are consequences.
    Evidence:
        The `exception` event (type, message, the last frames) with its step, and the ranks
        waiting in an open collective when the records end.
    """
    state = _state(ctx)
    if state is None:
        return
    waiting = sorted({r for s in state.stuck for r in s.waiting})
    for crashed in state.crashed:
        message = (
            (crashed.get("message") or "").splitlines()[0][:160] if crashed.get("message") else ""
        )
        title = (
            f"crash: rank {crashed['rank']} raised {crashed.get('type')} "
            f"at step {crashed.get('step')}"
        )
        title += f": {message}" if message else ""
        if crashed.get("frame"):
            title += f" in {crashed['frame']}"
        others = [r for r in waiting if r != crashed["rank"]]
        if others:
            title += f"; {ranks_phrase(others)} left waiting in {_collective(state.stuck[0])}"
        yield Finding(
            severity="high",
            title=title,
            ranks=[int(crashed["rank"])],
            evidence={"exception": crashed, "left_waiting": others,
                      "collectives": [_stuck_evidence(s) for s in state.stuck]},
            advice="fix the exception of this rank; the other ranks' timeouts follow from it",
            explains=[HANG, LOST],
        )  # fmt: skip


@rule(DESYNC, "failure.desync", None)
def desync(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """Ranks issued a different collective, size or dtype at the same place of a group.

    Symptom:
        The job hangs or fails in a collective, or (worse) goes on reducing tensors that do not
        match. PyTorch's Flight Recorder analyser calls these type, size and dtype mismatches.
    Likely cause:
        One rank skipped a collective or issued an extra one (a branch taken on one rank
        only, a parameter unused on one rank, an uneven last batch), so from there on its
        collectives pair with the wrong ones of the others.
    Fix:
        Make every rank issue the same collectives in the same order with the same shapes:
        look at what the named rank did differently before that sequence number.
    Evidence:
        At one sequence number of one group (the k-th collective each rank issued on it), the
        op, bytes and dtype of each rank; the rank that differs from the others.
    """
    state = _state(ctx)
    if state is None:
        return
    seen: set[tuple[Any, ...]] = set()
    for found in state.desync:
        key = (found["group"], found["seq"], found["rank"])
        if key in seen:
            continue
        seen.add(key)
        expected = found.get("expected") or {}
        what = _issue(found.get("op"), found.get("bytes"), found.get("dtype"), found.get("sizes"))
        wanted = _issue(expected.get("op"), expected.get("bytes"), expected.get("dtype"),
                        expected.get("sizes"))  # fmt: skip
        step = f" (step {found['step']})" if found.get("step") is not None else ""
        yield Finding(
            severity="high",
            title=f"desync: rank {found['rank']} issued {what} as #{found['seq']} of "
            f"{found['group']}{step} where the others issued {wanted} ({found['class']})",
            ranks=[int(found["rank"])],
            evidence=dict(found),
            advice="every rank must issue the same collectives in the same order and shapes; "
            "look at what this rank did differently just before",
            explains=[HANG],
        )


@rule(LOST, "failure.lost_rank", None)
def lost_rank(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """A rank whose records stop with no exception and no close while the others went on.

    Symptom:
        One rank file ends mid-step, without an `exception` or `rank_closed` record and without
        heartbeats after its last record, while other ranks kept writing (progress, or
        heartbeats while they waited for it).
    Likely cause:
        The process was killed (SIGKILL: the out-of-memory killer, a scheduler preempting it)
        or its node was lost; a Python exception would have been recorded.
    Fix:
        Look at the node's logs at the time of its last record (dmesg for the OOM killer, the
        scheduler's events); add memory headroom or handle preemption.
    Evidence:
        The rank's last record (step, span) and how long before the others' last record it
        was written, and the collective the others waited in for it (`never_joined`); window:
        3 median steps + 5 s (and the heartbeat period), or none where the launcher ended the
        others (their signal records) after its last record.
    """
    state = _state(ctx)
    if state is None:
        return
    where = {w.rank: w for w in state.ranks}
    for rank in state.lost:
        w = where.get(rank)
        if w is None:
            continue
        # the collective the others waited in for it: where the job stopped, the step the
        # records of a rank that died between two flushes do not reach
        never = next((s for s in state.stuck if rank in s.missing), None)
        evidence = _where_evidence(w)
        if never is not None:
            evidence["never_joined"] = _stuck_evidence(never)
        yield Finding(
            severity="high",
            title=f"rank {rank} lost: its records stop at step {w.step} ({w.span or 'no span'}) "
            f"with no exception and no close, {num(w.silent_s)} s before the others' last "
            "(killed, or its node lost)"
            + ("" if never is None else f"; it never joined {_collective(never)}"),
            ranks=[rank],
            evidence=evidence,
            advice="check the node's logs at that time (OOM killer, preemption)",
            explains=[HANG],
        )


@rule(UNDECIDABLE, "failure.undecidable", None)
def undecidable(ctx: RuleContext, limits: Mapping[str, float]) -> Iterable[Finding]:
    """The run did not complete, and its records cannot tell why.

    Symptom:
        The run is not complete (no `rank_closed`, the manifest not `complete`) and no record
        arrives any more, yet nothing was left open, no exception, stall or lost rank shows.
    Likely cause:
        The whole job was killed at once between two flushes, or the run was written by a
        collector without in-flight records (older versions), or only part of it was copied.
    Fix:
        Record with a collector that writes in-flight state and heartbeats (docs/collectors.md),
        or dump PyTorch's Flight Recorder beside the run (RUN/flight-recorder/).
    Evidence:
        The status reason: where the records stop and what is missing to decide; the ranks
        whose records stop steps before the others' (a trace cut short, a rank hung or dead)
        are named.
    """
    state = _state(ctx)
    if state is None or state.status != "undecidable" or not state.suspect:
        return
    # the ranks whose records stop steps before the others' are where to look first
    last = [w.step for w in state.ranks if w.step is not None]
    behind = sorted(w.rank for w in state.ranks if w.step is not None and w.step < max(last))
    yield Finding(severity="medium", title=f"did not complete, cause undecidable: {state.reason}",
                  ranks=behind, evidence={"reason": state.reason},
                  advice="record in-flight state (the collectors' watchdog) or dump the Flight "
                  "Recorder beside the run")  # fmt: skip


def _collective(stuck: Stuck) -> str:
    step = f", step {stuck.step}" if stuck.step is not None else ""
    return f"{stuck.label()} ({size(stuck.bytes)}{', ' + stuck.dtype if stuck.dtype else ''}{step})"


def _longest(stuck: Stuck) -> float:
    return max((s for s in stuck.waited_s.values() if s is not None), default=0.0)


def _waited(stuck: Stuck) -> str:
    times = [s for s in stuck.waited_s.values() if s is not None]
    return f"up to {num(max(times))} s" if times else "(for how long unknown)"


def _stopped(where: RankWhere) -> str:
    """`rank 2 stopped at step 6 in fwd (open, step 6), at loader.py:12 next()`."""
    text = f"rank {where.rank} stopped" + (
        f" at step {where.step}" if where.step is not None else ""
    )
    if where.span:
        text += f" in {where.span}"
    if where.stack_top:
        text += f", at {where.stack_top}"
    return text


def _issue(op: Any, bytes_: Any, dtype: Any, sizes: Any) -> str:
    amount = size(bytes_) if bytes_ is not None else (f"sizes {sizes}" if sizes else "?")
    return f"{op} ({amount}{', ' + str(dtype) if dtype else ''})"


def _stuck_evidence(stuck: Stuck) -> dict[str, Any]:
    return {"group": stuck.group, "seq": stuck.seq, "op": stuck.op, "bytes": stuck.bytes,
            "dtype": stuck.dtype, "step": stuck.step, "waiting": stuck.waiting,
            "missing": stuck.missing, "unseen": stuck.unseen, "members": stuck.members,
            "waited_s": {str(k): v for k, v in stuck.waited_s.items()},
            "source": stuck.source}  # fmt: skip


def _where_evidence(where: RankWhere) -> dict[str, Any]:
    return {"rank": where.rank, "state": where.state, "step": where.step, "span": where.span,
            "collective": where.collective, "stack_top": where.stack_top,
            "silent_s": where.silent_s}  # fmt: skip
