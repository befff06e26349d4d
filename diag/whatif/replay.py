"""Play a timeline back with given durations: each rank runs its events in order, a collective
completes at its last member's arrival plus that member's transfer, a receive after its send
has started plus the message (and a launched send with it), a wait when what it waits for has
completed.

With the measured durations the replay gives the measured step times back (the replay error
says how closely: clock offsets between hosts and records that match no peer cost accuracy);
with some durations replaced it gives the step times the run would have had (the
counterfactuals of diag/whatif/attribution.py).

The loop is compiled (numba) for large timelines: a 3D run of 1,024 ranks has hundreds of
thousands of events per replay and the attribution replays it a few dozen times; as plain
Python that was minutes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from diag.numeric.compiled import compiled as compiled_loop
from diag.numeric.compiled import for_size
from diag.whatif.timeline import Kind, Timeline

START, LAUNCH, SYNC, RECV, WAIT, LOCAL, END = (int(k) for k in (
    Kind.START, Kind.LAUNCH, Kind.SYNC, Kind.RECV, Kind.WAIT, Kind.LOCAL, Kind.END))  # fmt: skip


@dataclass(frozen=True)
class Durations:
    """What a replay may change: local time before each event, each member's transfer, each
    wait's time after what it waited for (ns, one entry per event)."""

    seg_ns: np.ndarray
    transfer_ns: np.ndarray
    post_ns: np.ndarray
    local_ns: np.ndarray | None = None
    """Each LOCAL event's own length (None: as measured): a send or receive to a peer nobody
    traced, less its waiting for that peer (diag/whatif/late_members.py)."""

    @classmethod
    def measured(cls, timeline: Timeline) -> Durations:
        ev = timeline.events
        return cls(
            ev["seg_ns"].to_numpy(dtype=np.float64).copy(),
            ev["transfer_ns"].to_numpy(dtype=np.float64).copy(),
            ev["post_ns"].to_numpy(dtype=np.float64).copy(),
        )


def relative_ns(timeline: Timeline) -> np.ndarray:
    """Measured starts of the events in ns after the earliest, as floats: absolute clocks
    (~1.8e18 ns) would round to 256 ns in a float and the error would add up over events."""
    a = timeline.events["a_ns"].to_numpy(dtype=np.int64)
    return (a - a.min()).astype(np.float64) if len(a) else np.zeros(0)


def local_own_ns(timeline: Timeline) -> np.ndarray:
    """Each event's own length as the replay holds a LOCAL one: from its start to its end,
    or, for a LOCAL event that began with the blocking event before it on its rank (one
    batched kernel recorded as two messages, a send and a receive, the unmatched one with the
    kernel's whole time: played one after the other, they counted it twice), from that one's
    end (float ns)."""
    ev = timeline.events
    a = ev["a_ns"].to_numpy(dtype=np.int64)
    e = ev["e_ns"].to_numpy(dtype=np.int64)
    kind = ev["kind"].to_numpy()
    local = kind == Kind.LOCAL
    blocking = kind != Kind.LAUNCH  # a launch holds no rank: what follows it is not its
    batched = np.zeros(len(ev), dtype=bool)
    batched[1:] = local[1:] & blocking[:-1] & (a[1:] == a[:-1])
    # (a message after a message of its batch is timed from their start: local_time.py)
    if "from_start" in ev:
        batched &= ~ev["from_start"].to_numpy(dtype=bool)
    batched[timeline.first[:-1]] = False  # each rank's first event
    previous_end = np.r_[0, e[:-1]]
    start = np.where(batched, np.maximum(a, previous_end), a)
    return np.maximum(e - start, 0).astype(np.float64)


def replay(timeline: Timeline, durations: Durations, compiled: bool | None = None) -> np.ndarray:
    """The replayed end time (ns after the earliest event, float) of every event; the loop
    compiled or not as `compiled` says (None: by the timeline's size)."""
    fixed = _fixed_inputs(timeline)
    if compiled is None:
        loop = for_size(_replay, len(timeline.events))
    else:
        loop = compiled_loop(_replay) if compiled else _replay
    own = fixed.own if durations.local_ns is None else durations.local_ns
    return _looped(
        loop,
        fixed.kind,
        np.ascontiguousarray(own, dtype=np.float64),
        fixed.instance,
        fixed.sender,
        fixed.one_way,
        fixed.from_start,
        fixed.relative,
        np.ascontiguousarray(durations.seg_ns, dtype=np.float64),
        np.ascontiguousarray(durations.transfer_ns, dtype=np.float64),
        np.ascontiguousarray(durations.post_ns, dtype=np.float64),
        fixed.first,
        timeline.member_ptr,
        timeline.member_event,
        timeline.wait_ptr,
        timeline.wait_event,
        timeline.wait_by_arrival,
        origin=fixed.origin,
    )


def _looped(loop: Callable[..., Any], *inputs: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """`loop` (`_replay`, compiled or not) run on `inputs` (its arguments up to
    `wait_by_arrival`) from each rank's `origin`, in the state it starts from; as Python, over
    lists: a numpy scalar's every read and write cost three times the loop's own work."""
    kind, first, member_ptr = (inputs[_PLACE[name]] for name in ("kind", "first", "member_ptr"))
    state = (
        np.full(len(kind), np.nan),  # arrived
        np.full(len(kind), np.nan),  # done
        member_ptr[1:] - member_ptr[:-1],  # members missing
        np.full(len(member_ptr) - 1, -np.inf),  # latest arrival
        origin.copy(),  # clock
        origin.copy(),  # started
        first[:-1].copy(),  # position
    )
    if loop is _replay:
        done = loop(*(a.tolist() for a in inputs), *(a.tolist() for a in state))
        return np.array(done, dtype=np.float64)
    return loop(*inputs, *state)


@dataclass(frozen=True)
class _FixedInputs:
    """What every replay of one timeline reads the same, as the compiled loop takes it: the
    attribution replays a timeline a few dozen times, and taking the arrays out of the events
    frame each time cost a fifth of the loop's own time."""

    kind: np.ndarray
    own: np.ndarray  # measured e - a of each event (float ns)
    instance: np.ndarray
    sender: np.ndarray
    one_way: np.ndarray  # a receive whose send is another receive's (it leaves the send alone)
    from_start: np.ndarray
    relative: np.ndarray  # relative_ns
    first: np.ndarray
    origin: np.ndarray  # where each rank's chain begins (relative ns)


def _fixed_inputs(timeline: Timeline) -> _FixedInputs:
    """The timeline's `_FixedInputs`, made by its first replay and kept on it."""
    fixed = timeline.derived.get("replay")
    if isinstance(fixed, _FixedInputs):
        return fixed
    ev = timeline.events
    opening = timeline.first[:-1]
    # each rank's chain begins where its first event's measured local time began (the end of
    # the step before the window, where one was recorded)
    relative = relative_ns(timeline)
    origin = relative[opening] - ev["seg_ns"].to_numpy(dtype=np.float64)[opening]
    fixed = _FixedInputs(
        kind=ev["kind"].to_numpy(dtype=np.int64),
        own=local_own_ns(timeline),
        instance=ev["instance"].to_numpy(dtype=np.int64),
        sender=ev["sender"].to_numpy(dtype=np.int64),
        one_way=(
            ev["one_way"].to_numpy(dtype=np.bool_)
            if "one_way" in ev
            else np.zeros(len(ev), dtype=np.bool_)
        ),
        from_start=ev["from_start"].to_numpy(dtype=np.bool_),
        relative=relative,
        first=timeline.first.astype(np.int64),
        origin=origin,
    )
    timeline.derived["replay"] = fixed
    return fixed


def _replay(kind, own, instance, sender, one_way, from_start, measured_start, seg, transfer, post,
            first, member_ptr, member_event, wait_ptr, wait_event, wait_by_arrival,
            arrived, done, missing, latest, clock, started, position):  # fmt: skip
    """Each rank runs until it meets something not yet complete; a collective completes when
    its last member arrives (a count per collective, no rescans). Inputs as in `replay`; the
    state it works in is given too (`replay` makes it), so that as Python every one of them is
    a list, compiled an array: `arrived` and `done` (NaN: not yet), each collective's members
    still `missing` and `latest` arrival, each rank's `clock`, when its chain's last event
    `started` (a launch may be timed from it) and its `position`. Returns `done`.

    Plain Python that numba compiles as it is (diag/numeric/compiled.py): one function, no calls of
    our own; `x != x` tests for NaN (not yet known)."""
    ranks = len(first) - 1
    active = [True] * ranks
    remaining = ranks
    while remaining > 0:
        progressed = False
        for r in range(ranks):
            if not active[r]:
                continue
            k, end = position[r], first[r + 1]
            while k < end:
                what = kind[k]
                arrival = (started[r] if from_start[k] else clock[r]) + seg[k]
                if what in (LAUNCH, SYNC) and arrived[k] != arrived[k]:
                    # a member arrives; the last one completes its collective
                    arrived[k] = arrival
                    inst = instance[k]
                    if inst >= 0:
                        latest[inst] = max(latest[inst], arrival)
                        missing[inst] -= 1
                        if missing[inst] == 0:
                            for i in range(member_ptr[inst], member_ptr[inst + 1]):
                                done[member_event[i]] = latest[inst] + transfer[member_event[i]]
                    progressed = True
                if what == LAUNCH:  # the rank goes on; a launch does not move its clock
                    k += 1
                    progressed = True
                    continue
                started[r] = arrival
                if what in (START, END):
                    done[k] = arrival
                elif what == LOCAL:  # a blocking send among them: its receive reads arrived
                    arrived[k] = arrival
                    done[k] = arrival + own[k]
                elif what == SYNC:
                    if done[k] != done[k]:
                        break
                elif what == RECV:  # a blocking send too: its receive reads arrived
                    arrived[k] = arrival
                    sent = arrived[sender[k]]
                    if sent != sent:
                        break
                    done[k] = max(arrival, sent) + transfer[k]
                    if kind[sender[k]] == LAUNCH and not one_way[k]:  # a launched send: both
                        # sides there (a receive standing in for another's leaves it alone)
                        done[sender[k]] = max(arrival, sent) + transfer[sender[k]]
                else:  # WAIT
                    ready = arrival
                    blocked = False
                    for i in range(wait_ptr[k], wait_ptr[k + 1]):
                        t = done[wait_event[i]]
                        if t != t:
                            blocked = True
                            break
                        if wait_by_arrival[i]:  # released at the last arrival
                            t -= transfer[wait_event[i]]
                        ready = max(ready, t)
                    if blocked:
                        break
                    done[k] = ready + post[k]
                # an op batched with the one before it (`from_start`) ran beside it: the rank
                # goes on when both are done
                clock[r] = max(clock[r], done[k]) if from_start[k] else done[k]
                k += 1
                progressed = True
            position[r] = k
            if k >= end:
                active[r] = False
                remaining -= 1
        if remaining == 0 or progressed:
            continue
        # No rank can go on (records that match no complete set of peers): complete the
        # blocked collective met first (by measured start) with the members that arrived.
        first_met, k = np.inf, -1
        for r in range(ranks):
            if active[r] and measured_start[position[r]] < first_met:
                first_met, k = measured_start[position[r]], position[r]
        if kind[k] == RECV:
            arrived[sender[k]] = arrived[k]  # the send never came
            continue
        lo, hi = (wait_ptr[k], wait_ptr[k + 1]) if kind[k] == WAIT else (k, k + 1)
        for w in range(lo, hi):
            event = wait_event[w] if kind[k] == WAIT else k
            inst = instance[event]
            if inst < 0:  # a launched send whose receive never came
                if done[event] != done[event]:
                    done[event] = arrived[event] + transfer[event]
                continue
            for i in range(member_ptr[inst], member_ptr[inst + 1]):
                done[member_event[i]] = latest[inst] + transfer[member_event[i]]
    return done


_PLACE = {name: i for i, name in enumerate(inspect.signature(_replay).parameters)}
"""Where each of `_replay`'s arguments is in its argument list (`_looped` reads three)."""


def step_times_ns(timeline: Timeline, done: np.ndarray) -> np.ndarray:
    """Per analysed step (ascending), the latest end minus the earliest start over ranks."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    steps = ev["step"].to_numpy()
    starts, ends = kind == START, kind == END
    order = np.unique(steps[starts])
    first = _by_step(steps[starts], done[starts], order, np.fmin)
    latest = _by_step(steps[ends], done[ends], order, np.fmax)
    return latest - first


def _by_step(steps: np.ndarray, times: np.ndarray, order: np.ndarray, ufunc) -> np.ndarray:
    index = np.searchsorted(order, steps)
    out = np.full(len(order), np.nan)
    ufunc.at(out, index, times)
    return out
