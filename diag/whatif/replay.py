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


def replay(timeline: Timeline, durations: Durations) -> np.ndarray:
    """The replayed end time (ns, float) of every event."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    own = (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64)  # LOCAL events' own time
    instance = ev["instance"].to_numpy()
    sender = ev["sender"].to_numpy()
    seg, transfer, post = durations.seg_ns, durations.transfer_ns, durations.post_ns
    arrived = np.full(len(ev), np.nan)
    done = np.full(len(ev), np.nan)
    clock = ev["a_ns"].to_numpy(dtype=np.float64)[timeline.first[:-1]].copy()
    position = timeline.first[:-1].copy()
    last = timeline.first[1:]
    members = timeline.members
    waits_on = timeline.waits_on
    unfinished = list(range(len(position)))

    def complete(inst: int, force: bool = False) -> bool:
        events = members[inst]
        times = arrived[events]
        if np.isnan(times).any() and not force:
            return False
        latest = np.nanmax(times)
        done[events] = latest + transfer[events]
        return True

    while unfinished:
        progressed = False
        blocked: list[int] = []
        for r in unfinished:
            k = position[r]
            while k < last[r]:
                arrival = clock[r] + seg[k]
                what = kind[k]
                if what in (Kind.START, Kind.END):
                    done[k] = arrival
                elif what == Kind.LOCAL:
                    done[k] = arrival + own[k]
                elif what == Kind.LAUNCH:
                    arrived[k] = arrival
                    if instance[k] >= 0 and np.isnan(done[k]):
                        complete(int(instance[k]))
                    clock[r] = arrival
                    k += 1
                    progressed = True
                    continue
                elif what == Kind.SYNC:
                    if np.isnan(arrived[k]):
                        arrived[k] = arrival
                        progressed = True
                    if np.isnan(done[k]) and not complete(int(instance[k])):
                        break
                elif what == Kind.RECV:
                    arrived[k] = arrival
                    sent = arrived[sender[k]]
                    if np.isnan(sent):
                        break
                    done[k] = max(arrival, sent) + transfer[k]
                elif what == Kind.WAIT:
                    awaited = done[waits_on[k]]
                    if np.isnan(awaited).any():
                        arrived[k] = arrival
                        break
                    done[k] = max(arrival, float(awaited.max())) + post[k]
                clock[r] = done[k]
                k += 1
                progressed = True
            position[r] = k
            if k < last[r]:
                blocked.append(r)
        unfinished = blocked
        if unfinished and not progressed:
            _unblock(timeline, unfinished, position, arrived, done, complete)
    return done


def _unblock(timeline, unfinished, position, arrived, done, complete) -> None:
    """No rank can go on (records that match no complete set of peers): complete the blocked
    collective that was met first with the members that arrived, so the replay goes on."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    candidates = sorted(unfinished, key=lambda r: ev["a_ns"].iat[position[r]])
    for r in candidates:
        k = position[r]
        if kind[k] == Kind.SYNC:
            complete(int(ev["instance"].iat[k]), force=True)
            return
        if kind[k] == Kind.WAIT:
            for launch in timeline.waits_on[k]:
                if np.isnan(done[launch]):
                    complete(int(ev["instance"].iat[launch]), force=True)
            return
        if kind[k] == Kind.RECV:
            sender = int(ev["sender"].iat[k])
            arrived[sender] = arrived[k]  # the send never came: the receive waits on nothing
            return


def step_times_ns(timeline: Timeline, done: np.ndarray) -> np.ndarray:
    """Per analysed step (ascending), the latest end minus the earliest start over ranks."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    steps = ev["step"].to_numpy()
    starts, ends = kind == Kind.START, kind == Kind.END
    order = np.unique(steps[starts])
    first = _by_step(steps[starts], done[starts], order, np.fmin)
    latest = _by_step(steps[ends], done[ends], order, np.fmax)
    return latest - first


def _by_step(steps: np.ndarray, times: np.ndarray, order: np.ndarray, ufunc) -> np.ndarray:
    index = np.searchsorted(order, steps)
    out = np.full(len(order), np.nan)
    ufunc.at(out, index, times)
    return out
