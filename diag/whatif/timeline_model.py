"""The timeline's data (diag/whatif/timeline.py builds it): the kinds of event, the `Timeline` of
every rank's events, and the limits that say when a rank waited."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import pandas as pd


class Kind(IntEnum):
    START = 0
    LAUNCH = 1
    SYNC = 2
    RECV = 3
    WAIT = 4
    LOCAL = 5
    END = 6


WAIT_SLACK_NS = 10_000
"""A wait depends on the launches that completed by its end (within this): a collective still
running after the wait ended (a profiler's view of a backend thread) did not hold it."""
MIN_WAITING_GAP_NS = 200_000
"""Time in no record shorter than this is never read as waiting (the launch of the next
operator, Python between two calls)."""


@dataclass
class Timeline:
    """Events of every rank, rank after rank in the order met (`first[r]:first[r+1]`)."""

    ranks: np.ndarray  # the ranks, ascending
    first: np.ndarray  # index of each rank's first event; one more entry at the end
    events: pd.DataFrame
    """rank, step, kind, a_ns, e_ns (arrival and measured end: the arrival is the measured
    start, earlier by `gap_wait_ns` where the rank waited in a gap before it), seg_ns and
    host_ns (local time before the event, and its host part), gap_ns (its time in no record
    right before the event), j (position in its step), from_start (timed from the start of
    the rank's event before it, not its end: a launch issued while that one blocked, or a
    message of the same batched kernel; diag/whatif/local_time.py), instance, group,
    transfer_ns (SYNC, LAUNCH, RECV: from the last arrival, or the send, to the end), inferred
    (a synchronisation inferred from time in no record, diag/whatif/untraced.py), absent_ns
    (the part of seg_ns spent waiting for group members nobody traced: the arrival moved to
    when the transfer began, diag/whatif/absent_members.py), stand_in (how many members
    nobody traced the rank stands for in that collective, absent_members.stand_ins), post_ns
    (WAIT: after the last awaited collective completed), sender (RECV: the send's event),
    lone (an asynchronous collective its rank had alone among traced members: its own
    instance) and lone_wait_ns (its waiting for them, absent_members.lone_launches), relayed
    (a receive from an untraced rank paired with the send it passed on,
    lockstep.surrogate_message_rows),
    late_members_ns (the part of transfer_ns spent waiting for group members nobody traced,
    diag/whatif/late_members.py), late_members (which: an index into `late_members`, -1) and
    late_members_unsure (a transfer no faster collective bounds: it may be all waiting)."""
    member_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    member_event: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The member events of collective instance i: member_event[member_ptr[i]:member_ptr[i+1]]
    (instance ids are dense, 0..I-1, in `events.instance`)."""
    wait_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    wait_event: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The LAUNCH events WAIT event k waits for: wait_event[wait_ptr[k]:wait_ptr[k+1]]."""
    wait_by_arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    """Per entry of wait_event: the wait is released by that collective's last arrival, not
    its completion."""
    late_members: list[tuple[int, ...]] = field(default_factory=list)
    """Sets of untraced group members the traced ones waited for (`events.late_members`)."""
    notes: list[str] = field(default_factory=list)
    ambiguous: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The gaps this timeline reads as the rank's own time though its group's ranks resumed
    closer together than they arrived (`readings`): rank, step, before, gap_ns."""
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What readers of the finished timeline compute from it once and keep for their next call
    (the replay's input arrays, diag/whatif/replay.py); the events do not change after
    `build`."""
