"""The waiting for ranks that left no records, as the replay of one timeline reads it
(diag/whatif/late_members.py finds it; diag/whatif/scenarios.py costs the rest): the part of
each transfer, and of each unmatched message's own time, that waited for untraced members;
those members' cause (UNTRACED: what their arriving with the last traced member saves); and
the replay with all that waiting removed, beside which a straggler or a slow stage is costed
where the replay holds those waits at their measured length."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from diag.numeric.intervals import union_length_by
from diag.whatif import timeline as tl
from diag.whatif.causes import Cause, CauseKind
from diag.whatif.replay import Durations, local_own_ns, replay, step_times_ns
from diag.whatif.waits import NS_PER_S

MAX_MEMBER_SETS = 4
"""Sets of untraced members costed one by one (the largest waits first)."""
HELD_SLACK_SHARE = 0.01
"""An event of the replay without the held waits for untraced members may end this much (a
share of the step) later than in the base before the replay's reading of them is doubted."""
HELD_REPLAY_ERROR = 0.10
"""The replay's error on the measured steps (median, relative) above which the waits held for
untraced members are not removed to cost a straggler beside them."""


def ranks_said(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def untraced_label(members: list[int], groups: list[str]) -> str:
    """A cause's label for untraced `members` waited for in `groups`."""
    return (f"{ranks_said(members)} (no records): {', '.join(groups)} communication "
            f"waiting for {'it' if len(members) == 1 else 'them'}")  # fmt: skip


class HeldWaits:
    """The waiting for untraced members in one timeline's replay. `saving`: what a replay
    with other durations saves against the base; `cause`: a Cause of a saving (ns);
    `base_done`, `replay_error`: the base replay's event ends and its error on the measured
    steps (median, relative); `absent_ns`: per event, the waiting for the members its rank
    stands for (its group's one traced member), in its local time."""

    def __init__(
        self,
        timeline: tl.Timeline,
        base: Durations,
        ok: np.ndarray,
        base_mean: float,
        absent_ns: np.ndarray,
        base_done: np.ndarray,
        replay_error: float,
        saving: Callable[[Durations], float],
        cause: Callable[..., Cause],
    ) -> None:
        self.timeline, self.base, self.ok, self.base_mean = timeline, base, ok, base_mean
        self.absent_ns = absent_ns
        self.rank = timeline.events["rank"].to_numpy()
        self._base_done, self._replay_error = base_done, replay_error
        self._saving, self._cause = saving, cause

    # --- the waiting, per event ----------------------------------------------------------------

    @cached_property
    def in_transfer_ns(self) -> np.ndarray:
        """Per event, the part of its transfer that waited for untraced members (0 where
        none: diag/whatif/late_members.py): a transfer at zero keeps it, as it keeps every
        other waiting for a late peer."""
        ev = self.timeline.events
        if "late_members_ns" not in ev:
            return np.zeros(len(ev))
        return np.minimum(ev["late_members_ns"].to_numpy(dtype=np.float64), self.base.transfer_ns)

    @cached_property
    def in_local_ns(self) -> np.ndarray:
        """Per event, the waiting for an untraced peer inside an unmatched message's own time
        (diag/whatif/late_members.py), at most that time."""
        ev = self.timeline.events
        if "late_members_local_ns" not in ev:
            return np.zeros(len(ev))
        late = ev["late_members_local_ns"].to_numpy(dtype=np.float64)
        return np.minimum(late, self.measured_local_ns)

    @cached_property
    def measured_local_ns(self) -> np.ndarray:
        return local_own_ns(self.timeline)

    @cached_property
    def unsure(self) -> np.ndarray:
        """Per event: a transfer that may be all waiting for untraced members."""
        ev = self.timeline.events
        if "late_members_unsure" not in ev:
            return np.zeros(len(ev), dtype=bool)
        return ev["late_members_unsure"].to_numpy(dtype=bool)

    def unsure_ranks(self) -> list[int]:
        code = self.timeline.events["late_members"].to_numpy()[self.unsure]
        members = self.timeline.late_members
        return sorted({r for c in np.unique(code) if c >= 0 for r in members[int(c)]})

    @cached_property
    def members_found_late(self) -> set[tuple[int, ...]]:
        """The sets of untraced members some traced rank waited for in a group of their own
        (`causes` gives their cause): a set the timeline lists but nobody waited for (every
        collective of the group on time) is not one."""
        waited = (self.in_transfer_ns > 0) | (self.in_local_ns > 0)
        code = self.timeline.events["late_members"].to_numpy()
        found = np.unique(code[waited & (code >= 0)])
        return {tuple(self.timeline.late_members[int(i)]) for i in found}

    # --- the replay without it ----------------------------------------------------------------

    @cached_property
    def removed(self) -> tuple[Durations, float] | None:
        """The waits for untraced members the replay holds at their measured length removed
        (in a collective's transfer: one a rank had alone, or one whose traced members waited
        for them beyond the transfer; a received message relayed or a message to an untraced
        peer: its own time's), and what that alone saves; None where there are none. Every
        such wait, not only those of ranks with no traced partner: a data-parallel all-reduce
        of three traced members waiting for a lost fourth (dp4 x tp8 x pp8, the straggler's
        next stage's node lost) held every replica's step end, and the straggler read as
        costing nothing (PIP002 came first)."""
        in_transfer = self.in_transfer_ns
        if not ((in_transfer > 0).any() or (self.in_local_ns > 0).any()):
            return None
        local = self.measured_local_ns - self.in_local_ns
        removed = Durations(self.base.seg_ns, self.base.transfer_ns - in_transfer,
                            self.base.post_ns, local)  # fmt: skip
        # less waiting cannot end an event later, and the replay must give the steps as
        # measured: else it cannot read those waits (records it could not pair, resolved as
        # they came), and nothing is claimed
        without = replay(self.timeline, removed)
        if np.nanmax(without - self._base_done, initial=0.0) > HELD_SLACK_SHARE * self.base_mean:
            return None
        if self._replay_error > HELD_REPLAY_ERROR:
            return None
        times = step_times_ns(self.timeline, without)
        return removed, max(self.base_mean - float(times[self.ok].mean()), 0.0)

    def beside(self, seg_ns: np.ndarray, baseline_seg_ns: np.ndarray | None = None) -> float:
        """What the local times `seg_ns` save with the held waits for untraced members
        removed, beyond what `baseline_seg_ns` (None: the measured local times) saves with
        them removed; 0 where there are none (`removed`)."""
        held = self.removed
        if held is None:
            return 0.0
        alone = held[1]
        if baseline_seg_ns is not None:
            alone = self._saving(self._with_removed(baseline_seg_ns))
        return max(self._saving(self._with_removed(seg_ns)) - alone, 0.0)

    def _with_removed(self, seg_ns: np.ndarray) -> Durations:
        held = self.removed
        assert held is not None  # `beside` asked only where there is one
        removed = held[0]
        return Durations(seg_ns, removed.transfer_ns, removed.post_ns, removed.local_ns)

    # --- the members' cause ---------------------------------------------------------------

    def causes(self) -> list[Cause]:
        """Per set of untraced members the traced ones waited for (the largest waits first, at
        most MAX_MEMBER_SETS sets): what those members arriving with the last traced one
        saves. Their lateness is read from sizes (diag/whatif/late_members.py), a lower
        bound."""
        late = self.in_transfer_ns
        if not ((late > 0).any() or (self.in_local_ns > 0).any()):
            return []
        code = self.timeline.events["late_members"].to_numpy()
        steps = max(int(self.ok.sum()), 1)
        both = late + self.in_local_ns
        totals = pd.Series(both).groupby(code).sum().drop(-1, errors="ignore")
        causes = []
        for index in totals[totals > 0].nlargest(MAX_MEMBER_SETS).index:
            members = list(self.timeline.late_members[int(index)])
            mine = code == index
            on_time = self.base.transfer_ns - np.where(mine, late, 0.0)
            # where a rank stood in for them (their group's one traced member), their
            # lateness is in its local time: removed as well
            own = self.base.seg_ns - np.where(mine, np.minimum(self.absent_ns, self.base.seg_ns), 0)
            # and a message to one of them held its sender or receiver: its waiting removed
            local = self.measured_local_ns - np.where(mine, self.in_local_ns, 0.0)
            saved = self._saving(Durations(own, on_time, self.base.post_ns, local))
            waiting = mine & (both > 0)
            peers = sorted(int(r) for r in np.unique(self.rank[waiting]))
            groups = sorted({str(g) for g in self.timeline.events["group"].to_numpy()[waiting]})
            evidence: dict[str, Any] = {
                "waiting_ranks": peers,
                "groups": groups,
                "median_wait_s": float(np.median(both[waiting])) / NS_PER_S,
                "collectives_waited_per_step": float(waiting.sum()) / max(len(peers), 1) / steps,
                "wait_per_step_s": self._wait_union_ns(waiting, both) / max(len(peers), 1)
                / steps / NS_PER_S,
            }  # fmt: skip
            causes.append(self._cause(CauseKind.UNTRACED, untraced_label(members, groups), saved,
                                      ranks=members, group=groups[0] if len(groups) == 1 else None,
                                      evidence=evidence))  # fmt: skip
        return causes

    def _wait_union_ns(self, waiting: np.ndarray, wait_ns: np.ndarray) -> float:
        """The time the events `waiting` waited (`wait_ns` each, from their arrival), each
        rank's waits as a union: asynchronous collectives in flight together (a data-parallel
        all-reduce's buckets waiting for the same untraced member) wait at once, and summed
        they read more than the step."""
        ev = self.timeline.events
        start = ev["a_ns"].to_numpy(dtype=np.int64)[waiting]
        frame = pd.DataFrame({"rank": self.rank[waiting].astype(np.int64), "t0": start,
                              "t1": start + wait_ns[waiting].astype(np.int64)})  # fmt: skip
        return float(union_length_by(frame, ["rank"]).sum())
