"""Play a timeline back with given durations: each rank runs its events in order, a collective
completes at its last member's arrival plus that member's transfer, a receive after its send
has started plus the message, a wait when what it waits for has completed.

With the measured durations the replay gives the measured step times back (the replay error
says how closely: clock offsets between hosts and records that match no peer cost accuracy);
with some durations replaced it gives the step times the run would have had (the
counterfactuals of diag/whatif/attribution.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diag.whatif.timeline import Kind, Timeline

START, LAUNCH, SYNC, RECV, WAIT, LOCAL, END = (int(k) for k in (
    Kind.START, Kind.LAUNCH, Kind.SYNC, Kind.RECV, Kind.WAIT, Kind.LOCAL, Kind.END))  # fmt: skip
"""The kinds as plain ints: the loop compares them millions of times."""


@dataclass(frozen=True)
class Durations:
    """What a replay may change: local time before each event, each member's transfer, each
    wait's time after what it waited for (ns, one entry per event)."""

    seg_ns: np.ndarray
    transfer_ns: np.ndarray
    post_ns: np.ndarray

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


def replay(timeline: Timeline, durations: Durations) -> np.ndarray:
    """The replayed end time (ns after the earliest event, float) of every event.

    A plain loop over plain lists (the events of a window are thousands to a few hundred
    thousand): each rank runs until it meets something not yet complete; a collective
    completes when its last member arrives (a count per collective, no rescans)."""
    ev = timeline.events
    kind = ev["kind"].to_numpy().tolist()
    own = (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64).tolist()  # LOCAL events
    instance = ev["instance"].to_numpy().tolist()
    sender = ev["sender"].to_numpy().tolist()
    from_start = ev["from_start"].to_numpy().tolist()
    seg = durations.seg_ns.tolist()
    transfer = durations.transfer_ns.tolist()
    post = durations.post_ns.tolist()
    nan = float("nan")
    arrived = [nan] * len(kind)
    done = [nan] * len(kind)
    # each rank's chain begins where its first event's measured local time began (the end of
    # the step before the window, where one was recorded)
    opening = timeline.first[:-1]
    origin = relative_ns(timeline)[opening] - ev["seg_ns"].to_numpy(dtype=np.float64)[opening]
    clock = origin.tolist()
    started = list(clock)  # when the chain's last event began (a launch may be timed from it)
    position = timeline.first[:-1].tolist()
    last = timeline.first[1:].tolist()
    members = timeline.members
    waits_on = timeline.waits_on
    missing = {inst: len(events) for inst, events in members.items()}
    latest = dict.fromkeys(members, -np.inf)

    def arrive(k: int, at: float) -> None:
        if arrived[k] == arrived[k]:  # not NaN: counted already
            return
        arrived[k] = at
        inst = instance[k]
        if inst < 0:
            return
        latest[inst] = max(latest[inst], at)
        missing[inst] -= 1
        if missing[inst] == 0:
            finish(inst)

    def finish(inst: int) -> None:
        for m in members[inst]:
            done[m] = latest[inst] + transfer[m]

    unfinished = list(range(len(position)))
    while unfinished:
        progressed = False
        blocked: list[int] = []
        for r in unfinished:
            k, end = position[r], last[r]
            while k < end:
                what = kind[k]
                if what == LAUNCH:
                    arrive(k, (started[r] if from_start[k] else clock[r]) + seg[k])
                    k += 1
                    progressed = True
                    continue
                arrival = clock[r] + seg[k]
                started[r] = arrival
                if what in (START, END):
                    done[k] = arrival
                elif what == LOCAL:
                    done[k] = arrival + own[k]
                elif what == SYNC:
                    if arrived[k] != arrived[k]:
                        arrive(k, arrival)
                        progressed = True
                    if done[k] != done[k]:
                        break
                elif what == RECV:
                    sent = arrived[sender[k]]
                    if sent != sent:
                        arrived[k] = arrival
                        break
                    done[k] = max(arrival, sent) + transfer[k]
                else:  # WAIT
                    awaited = [done[w] for w in waits_on[k]]
                    if any(t != t for t in awaited):
                        break
                    done[k] = max(arrival, max(awaited)) + post[k]
                clock[r] = done[k]
                k += 1
                progressed = True
            position[r] = k
            if k < end:
                blocked.append(r)
        unfinished = blocked
        if unfinished and not progressed:
            _unblock(timeline, unfinished, position, arrived, latest, finish)
    return np.asarray(done, dtype=np.float64)


def _unblock(timeline, unfinished, position, arrived, latest, finish) -> None:
    """No rank can go on (records that match no complete set of peers): complete the blocked
    collective that was met first with the members that arrived, so the replay goes on."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    candidates = sorted(unfinished, key=lambda r: ev["a_ns"].iat[position[r]])
    for r in candidates:
        k = position[r]
        if kind[k] == SYNC:
            finish(int(ev["instance"].iat[k]))
            return
        if kind[k] == WAIT:
            for launch in timeline.waits_on[k]:
                finish(int(ev["instance"].iat[launch]))
            return
        if kind[k] == RECV:
            arrived[int(ev["sender"].iat[k])] = arrived[k]  # the send never came
            return


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
