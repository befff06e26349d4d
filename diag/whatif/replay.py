"""Play a timeline back with given durations: each rank runs its events in order, a collective
completes at its last member's arrival plus that member's transfer, a receive after its send
has started plus the message, a wait when what it waits for has completed.

With the measured durations the replay gives the measured step times back (the replay error
says how closely: clock offsets between hosts and records that match no peer cost accuracy);
with some durations replaced it gives the step times the run would have had (the
counterfactuals of diag/whatif/attribution.py).

The loop is compiled (numba): a 3D run of 1,024 ranks has millions of events per replay and
the attribution replays it a few dozen times; as plain Python that was minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

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
    """The replayed end time (ns after the earliest event, float) of every event."""
    ev = timeline.events
    opening = timeline.first[:-1]
    # each rank's chain begins where its first event's measured local time began (the end of
    # the step before the window, where one was recorded)
    relative = relative_ns(timeline)
    origin = relative[opening] - ev["seg_ns"].to_numpy(dtype=np.float64)[opening]
    return _replay(
        ev["kind"].to_numpy(dtype=np.int64),
        (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64),
        ev["instance"].to_numpy(dtype=np.int64),
        ev["sender"].to_numpy(dtype=np.int64),
        ev["from_start"].to_numpy(dtype=np.bool_),
        relative,
        np.ascontiguousarray(durations.seg_ns, dtype=np.float64),
        np.ascontiguousarray(durations.transfer_ns, dtype=np.float64),
        np.ascontiguousarray(durations.post_ns, dtype=np.float64),
        timeline.first.astype(np.int64),
        origin,
        timeline.member_ptr,
        timeline.member_event,
        timeline.wait_ptr,
        timeline.wait_event,
    )


@numba.njit(cache=True)
def _replay(kind, own, instance, sender, from_start, measured_start, seg, transfer, post,
            first, origin, member_ptr, member_event, wait_ptr, wait_event):  # fmt: skip
    """Each rank runs until it meets something not yet complete; a collective completes when
    its last member arrives (a count per collective, no rescans). Arrays as in `replay`."""
    n, ranks, instances = len(kind), len(first) - 1, len(member_ptr) - 1
    arrived = np.full(n, np.nan)
    done = np.full(n, np.nan)
    missing = np.diff(member_ptr).copy()
    latest = np.full(instances, -np.inf)
    clock = origin.copy()
    started = origin.copy()  # when the chain's last event began (a launch may be timed from it)
    position = first[:-1].copy()
    active = np.ones(ranks, dtype=np.bool_)
    remaining = ranks
    while remaining > 0:
        progressed = False
        for r in range(ranks):
            if not active[r]:
                continue
            k, end = position[r], first[r + 1]
            while k < end:
                what = kind[k]
                if what == LAUNCH:
                    at = (started[r] if from_start[k] else clock[r]) + seg[k]
                    _arrive(k, at, arrived, instance, latest, missing, member_ptr, member_event,
                            done, transfer)  # fmt: skip
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
                    if np.isnan(arrived[k]):
                        _arrive(k, arrival, arrived, instance, latest, missing, member_ptr,
                                member_event, done, transfer)  # fmt: skip
                        progressed = True
                    if np.isnan(done[k]):
                        break
                elif what == RECV:
                    sent = arrived[sender[k]]
                    if np.isnan(sent):
                        arrived[k] = arrival
                        break
                    done[k] = max(arrival, sent) + transfer[k]
                else:  # WAIT
                    ready = arrival
                    blocked = False
                    for i in range(wait_ptr[k], wait_ptr[k + 1]):
                        t = done[wait_event[i]]
                        if np.isnan(t):
                            blocked = True
                            break
                        ready = max(ready, t)
                    if blocked:
                        break
                    done[k] = ready + post[k]
                clock[r] = done[k]
                k += 1
                progressed = True
            position[r] = k
            if k >= end:
                active[r] = False
                remaining -= 1
        if remaining > 0 and not progressed:
            _unblock(kind, instance, sender, measured_start, position, active, arrived, latest,
                     member_ptr, member_event, done, transfer, wait_ptr, wait_event)  # fmt: skip
    return done


@numba.njit(cache=True)
def _arrive(k, at, arrived, instance, latest, missing, member_ptr, member_event, done, transfer):
    if not np.isnan(arrived[k]):  # counted already
        return
    arrived[k] = at
    inst = instance[k]
    if inst < 0:
        return
    latest[inst] = max(latest[inst], at)
    missing[inst] -= 1
    if missing[inst] == 0:
        _finish(inst, latest, member_ptr, member_event, done, transfer)


@numba.njit(cache=True)
def _finish(inst, latest, member_ptr, member_event, done, transfer):
    for i in range(member_ptr[inst], member_ptr[inst + 1]):
        m = member_event[i]
        done[m] = latest[inst] + transfer[m]


@numba.njit(cache=True)
def _unblock(kind, instance, sender, measured_start, position, active, arrived, latest,
             member_ptr, member_event, done, transfer, wait_ptr, wait_event):  # fmt: skip
    """No rank can go on (records that match no complete set of peers): complete the blocked
    collective that was met first (by measured start) with the members that arrived, so the
    replay goes on."""
    met = np.full(len(position), np.inf)
    for r in range(len(position)):
        if active[r]:
            met[r] = measured_start[position[r]]
    order = np.argsort(met)
    for r in order:
        if not active[r]:
            continue
        k = position[r]
        if kind[k] == SYNC:
            _finish(instance[k], latest, member_ptr, member_event, done, transfer)
            return
        if kind[k] == WAIT:
            for i in range(wait_ptr[k], wait_ptr[k + 1]):
                _finish(instance[wait_event[i]], latest, member_ptr, member_event, done, transfer)
            return
        if kind[k] == RECV:
            arrived[sender[k]] = arrived[k]  # the send never came
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
