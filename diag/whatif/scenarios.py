"""The counterfactual replays of one timeline (diag/whatif/attribution.py runs them): each
replays the measured run with some durations replaced, and returns the `Cause`s whose cost is
the step time it saves (the list of scenarios: attribution.py's docstring). The waiting for
ranks that left no records is diag/whatif/held_waits.py's."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from diag.contract import ledger
from diag.read.load import RunData
from diag.read.roles import rank_roles
from diag.whatif import descheduled as ds
from diag.whatif import timeline as tl
from diag.whatif.absent_members import members_own_time, waited_for_members
from diag.whatif.causes import (
    Cause,
    CauseKind,
    imbalance_explained,
    straggler_explained,
)
from diag.whatif.held_waits import HeldWaits, untraced_label
from diag.whatif.late_members import untraced_in_groups
from diag.whatif.places import (
    group_codes,
    group_medians_per_element,
    peer_medians,
    stage_floors,
    stage_means,
    stage_places,
)
from diag.whatif.replay import Durations, replay, step_times_ns
from diag.whatif.waits import NS_PER_S

MAX_CANDIDATES = 4
"""Ranks whose persistent excess is replayed one by one (the largest excesses)."""
MIN_EXCESS_SHARE = 0.01
"""A rank whose typical excess, or whose net excess over the whole step, is below this share of
the step is no straggler candidate."""


class Scenarios:
    """The counterfactual replays of one timeline."""

    def __init__(
        self,
        run: RunData,
        timeline: tl.Timeline,
        base: Durations,
        ok: np.ndarray,
        base_mean: float,
        host: pd.DataFrame,
        base_done: np.ndarray,
        replay_error: float,
    ) -> None:
        """`base_done` and `replay_error`: the base replay's end of every event and its
        error on the measured steps (median, relative), as the attribution read them."""
        self.run, self.timeline, self.base, self.ok, self.base_mean = (
            run,
            timeline,
            base,
            ok,
            base_mean,
        )
        ev = timeline.events
        self.rank = ev["rank"].to_numpy()
        self.step = ev["step"].to_numpy()
        self.j = ev["j"].to_numpy()
        self.host = ev["host_ns"].to_numpy(dtype=np.float64)
        none = pd.Series(0, index=ev.index)
        self.absent_ns = ev.get("absent_ns", none).to_numpy(dtype=np.float64)
        self.role = rank_roles(run, timeline.ranks)
        self.peer_median = peer_medians(ev, self.role)
        self.stage_mean = stage_means(ev, self.role)
        self.stage_floor = stage_floors(ev, self.role)
        self.place = stage_places(ev, self.role)
        self.balanced = 0.0  # set by `imbalance`
        self.host_steps = host
        self._base_done, self._replay_error = base_done, replay_error

    def saving(self, durations: Durations) -> float:
        times = step_times_ns(self.timeline, replay(self.timeline, durations))
        return max(self.base_mean - float(times[self.ok].mean()), 0.0)

    def _cause(self, kind: CauseKind, label: str, saved_ns: float, **fields: Any) -> Cause:
        return Cause(kind, label, saved_ns / NS_PER_S, saved_ns / self.base_mean, **fields)

    @cached_property
    def held(self) -> HeldWaits:
        """The waiting for untraced members (diag/whatif/held_waits.py)."""
        return HeldWaits(self.timeline, self.base, self.ok, self.base_mean, self.absent_ns,
                         self._base_done, self._replay_error, self.saving, self._cause)  # fmt: skip

    def untraced_unsure_ranks(self) -> list[int]:
        return self.held.unsure_ranks()

    def all(self) -> list[Cause]:
        causes = [*self.stragglers(), *self.imbalance(), *self.stages(), *self.transfers()]
        causes += self.schedule() + self.descheduled() + self.held.causes()
        return [c for c in causes if c.cost_s > 0]

    # --- local time ------------------------------------------------------------------------

    @cached_property
    def _pieces(self) -> dict[str, np.ndarray]:
        """The local time before each event, whole and split into compute, the waiting for
        untraced members its rank stands for (`absent`: inside a collective of a group whose
        other members left no records, diag/whatif/absent_members.py; in no compute span) and
        the rest of the host time."""
        seg = self.base.seg_ns
        outside_compute = np.minimum(self.host, seg)
        absent = np.minimum(np.clip(self.absent_ns, 0, None), outside_compute)
        return {"all": seg, "host": outside_compute - absent, "compute": seg - outside_compute,
                "absent": absent}  # fmt: skip

    @cached_property
    def _typical(self) -> dict[str, np.ndarray]:
        """Per piece, per event: the typical (median over steps) difference of its rank's
        local time at this place of the step from its peers' median (0 without peers)."""
        codes = group_codes(self.rank, self.j)
        out = {}
        for name, part in self._pieces.items():
            peers = self._seg_peer_median if name == "all" else self.peer_median(part)
            out[name] = np.nan_to_num(group_medians_per_element(codes, part - peers))
        return out

    @cached_property
    def _excesses(self) -> dict[str, np.ndarray]:
        """Per piece, per event: the typical excess (the positive difference), at most the
        time itself."""
        return {
            name: np.minimum(np.clip(self._typical[name], 0, None), self._pieces[name])
            for name in self._pieces
        }

    @cached_property
    def _seg_peer_median(self) -> np.ndarray:
        """The peers' median of the local time before each event (the excesses and the ideal
        step both read it)."""
        return self.peer_median(self.base.seg_ns)

    def _without(self, ranks: list[int], part: str) -> Durations:
        seg = self.base.seg_ns
        mine = np.isin(self.rank, ranks)
        excess = self._excesses[part]
        return Durations(seg - np.where(mine, excess, 0), self.base.transfer_ns, self.base.post_ns)

    @cached_property
    def leveled(self) -> Durations:
        """Every rank's persistent excess removed (the imbalance and stage replays share it)."""
        return self._without(list(self.timeline.ranks), "all")

    @cached_property
    def leveled_saving(self) -> float:
        return self.saving(self.leveled)

    def _split(self, rank: int, saved: float) -> tuple[float, float]:
        """What leveling only the rank's host time, and only its compute, would save (one
        replay each; none where the rank has no excess of that kind: the other is all)."""
        mine = self.rank == rank
        host_excess = float(self._excesses["host"][mine].sum())
        compute_excess = float(self._excesses["compute"][mine].sum())
        host = self._leveling_saves(rank, "host") if host_excess > 0 else 0.0
        if compute_excess <= 0:
            return host, 0.0
        return host, self._leveling_saves(rank, "compute") if host_excess > 0 else saved

    def _leveling_saves(self, rank: int, part: str) -> float:
        """What leveling the rank's excess of `part` (`_pieces`) saves, as its whole excess
        is costed: alone, or beside the held waits for untraced members removed (each part
        read the second way too: read only alone, where the whole's saving came from beside
        them, both parts read 0 and the straggler was named for its host time)."""
        return max(self.saving(self._without([rank], part)), self._saving_beside_held(rank, part))

    def stragglers(self) -> list[Cause]:
        """The ranks with the largest typical excess, among those whose local time over the
        whole step is also above their peers' (net of the places where it is below): a rank
        slower at some places and as much faster at others is not a straggler. With two
        peers the excesses mirror each other, and on a loaded host the peer of a straggler
        computes longer elsewhere in the step (docs/metrics.md): an excess, not a straggler."""
        steps = max(int(self.ok.sum()), 1)
        # measured once, on the chain: a launch's local time overlaps its chain's (it is timed
        # from the chain's previous event), so summing it too counted the excess twice
        on_chain = self.timeline.events["kind"].to_numpy() != tl.Kind.LAUNCH
        per_rank = pd.Series(self._excesses["all"] * on_chain).groupby(self.rank).sum() / steps
        net = pd.Series(self._typical["all"] * on_chain).groupby(self.rank).sum() / steps
        floor = MIN_EXCESS_SHARE * self.base_mean
        candidates = per_rank[(per_rank > floor) & (net > floor)].nlargest(MAX_CANDIDATES)
        causes = []
        for rank in candidates.index:
            saved = self._leveling_saves(int(rank), "all")
            untraced = self._waiting_for_untraced(int(rank), saved)
            if untraced is not None:  # the members it waited for, not the rank
                causes += [c for c in untraced if c.cost_s > 0]
                continue
            host, compute = self._split(int(rank), saved)
            kind = CauseKind.HOST if host > compute else CauseKind.STRAGGLER
            if kind == CauseKind.HOST:
                label = f"rank {rank}: host time (data loading, work outside the recorded spans)"
            else:
                label = f"rank {rank}: slower compute than its peers"
            # per step, never beyond the step: a rank's local time over several places of
            # the step can add up to more than the step where other ranks' waits hid it
            excess = min(float(candidates[rank]), self.base_mean)
            queued = min(self._queued_excess_ns(int(rank)), excess)
            causes.append(self._cause(kind, label, saved, ranks=[int(rank)], evidence={
                "host_saving_s": host / NS_PER_S, "compute_saving_s": compute / NS_PER_S,
                "typical_excess_per_step_s": excess / NS_PER_S,
                "net_excess_per_step_s": min(float(net[rank]), self.base_mean) / NS_PER_S,
                "reaching_step_end_s": saved / NS_PER_S,
                "absorbed_per_step_s": max(excess - saved, 0.0) / NS_PER_S,
                "queued_excess_per_step_s": queued / NS_PER_S,
                "own_excess_per_step_s": (excess - queued) / NS_PER_S,
                "explained": straggler_explained(excess, saved, queued),
            }))  # fmt: skip
        return causes

    def _saving_beside_held(self, rank: int, part: str = "all") -> float:
        """What leveling the rank's excess of `part` saves once the held waits for untraced
        members are removed, beyond what their removal saves alone (0 where there are none).
        Held at their measured length, those waits keep the step whatever the rank does:
        where an untraced rank was late because it waited for this one (the next stage after
        a straggler, its trace lost), the straggler read as costing nothing (a dp2 x pp4 job,
        rank 6 lost: rank 5's 149 ms read 0). The untraced members' own cause (BAL006) is
        costed by that removal alone, so what is late on its own stays theirs."""
        if self.held.removed is None:
            return 0.0
        mine = self.rank == rank
        return self.held.beside(self.base.seg_ns - np.where(mine, self._excesses[part], 0.0))

    def _waiting_for_untraced(self, rank: int, saved: float) -> list[Cause] | None:
        """Where the rank's excess is mostly its waiting for the members it stands for (the
        only traced rank of its group), those members are the straggler, not the rank: their
        cause (UNTRACED, as `HeldWaits.causes` gives it where two or more members were
        traced), costed by their waiting at its peers' median; none where `HeldWaits.causes`
        already names those members (found late in a group of their own: named there, the
        rank was named too, a straggler at the same cost, dp4 x tp2 x pp2 with the
        straggler's trace lost). None where the rank's own time, host or compute, saves at
        least as much: the rank's own excess."""
        mine = self.rank == rank
        if float(self._excesses["absent"][mine].sum()) <= 0:
            return None
        absent = self.saving(self._without([rank], "absent"))
        if absent <= 0 or absent < 0.5 * saved:
            return None
        waited = mine & waited_for_members(self._pieces["absent"], self._arrival_to_end_ns)
        if not waited.any():
            return None
        groups = sorted({str(g) for g in self.timeline.events["group"].to_numpy()[waited]})
        traced = {int(r) for r in np.unique(self.rank)}
        missing = untraced_in_groups(self.run.manifest, traced, at_least=1)
        members = sorted({m for g in groups for m in missing.get((g, rank), ())})
        if not members:
            return None
        if tuple(members) in self.held.members_found_late:
            return []
        steps = max(int(self.ok.sum()), 1)
        label = untraced_label(members, groups)
        return [self._cause(CauseKind.UNTRACED, label, absent, ranks=members,
                           group=groups[0] if len(groups) == 1 else None, evidence={
            "waiting_ranks": [rank],
            "groups": groups,
            "median_wait_s": float(np.median(self._pieces["absent"][waited])) / NS_PER_S,
            "collectives_waited_per_step": float(waited.sum()) / steps,
            "wait_per_step_s": float(self._pieces["absent"][waited].sum()) / steps / NS_PER_S,
            "stood_in_by": rank,
        })]  # fmt: skip

    def _queued_excess_ns(self, rank: int) -> float:
        """How much longer per step `rank`'s training thread waited for a core than the median
        of its peers' (same stage), where the steps recorded it (0 elsewhere): part of its
        excess that is the host's, not its own work (a rank waking from a sleep on a loaded
        host waits for a core too)."""
        table = self.host_steps
        column = "thread_queued_s"
        if table is None or table.empty or column not in table or table[column].isna().all():
            return 0.0
        mine = table[table["step"].isin(np.unique(self.step))]
        mean = mine.groupby("rank")[column].mean().dropna()
        stage = self.role["stage"]
        peers = [int(r) for r in mean.index if int(r) != rank
                 and stage.get(r) == stage.get(rank)]  # fmt: skip
        if rank not in mean.index or not peers:
            return 0.0
        return max(float(mean[rank] - mean[peers].median()) * NS_PER_S, 0.0)

    def imbalance(self) -> list[Cause]:
        """Random imbalance: with every rank's persistent excess removed, each rank's local time
        at each place of each step replaced by the mean over its stage's ranks (the ranks of
        one stage do the same work; balancing data or sequence lengths moves work between them
        and deletes none, so the mean, not the fastest rank, is what balance would give).

        The evidence adds what the per-step variation costs if it is noise rather than work
        (`if_noise_saves_s`): each place at the quickest its stage ever did it (any rank, any
        step), as delays from noise (interrupts, other processes, pauses, a sleep) only add
        time. It is a bound, not the cost: work that varies per batch is no noise, and a loaded
        host's scheduling makes every piece vary (read beside HST001)."""
        leveled, persistent = self.leveled, self.leveled_saving
        seg = leveled.seg_ns
        # the stage's mean of its ranks' own work: a traced rank's wait for members nobody
        # traced (absent_ns) is theirs, read with them where the rank stands for them
        # (diag/whatif/absent_members.py: the last member measured, the others from a sample)
        own = np.clip(seg - self.absent_ns, 0, None)
        mean = self.stage_mean(self._members_own(seg))
        even = Durations(np.where(np.isnan(mean), seg, mean), leveled.transfer_ns, leveled.post_ns)
        per_step = self.saving(even)
        self.balanced = max(per_step, persistent)  # all imbalance: at least the persistent
        random_part = max(per_step - persistent, 0.0)
        floor = self.stage_floor(own)
        quickest = np.minimum(seg, np.where(np.isnan(floor), seg, floor))
        quick = self.saving(Durations(quickest, leveled.transfer_ns, leveled.post_ns))
        if_noise = max(quick - persistent, random_part)
        explained = imbalance_explained(random_part, if_noise)
        return [self._cause(CauseKind.IMBALANCE, "random per-step imbalance across ranks (data or "
                            "sequence lengths, jitter)", random_part, evidence={
                                "every_step_balanced_s": per_step / NS_PER_S,
                                "persistent_excess_removed_s": persistent / NS_PER_S,
                                "if_noise_saves_s": if_noise / NS_PER_S,
                                "explained": explained})]  # fmt: skip

    def _members_own(self, seg: np.ndarray) -> np.ndarray:
        """Per event, the mean own time before it of its rank and the untraced members it
        stands for (absent_members.members_own_time), from the local times `seg`."""
        ev = self.timeline.events
        if "stand_in" not in ev:
            return np.clip(seg - self.absent_ns, 0, None)
        stand_in = ev["stand_in"].to_numpy(dtype=np.float64)
        return members_own_time(seg, self.absent_ns, self._arrival_to_end_ns, stand_in, self.place)

    @cached_property
    def _arrival_to_end_ns(self) -> np.ndarray:
        """Per event, its time from its rank's arrival to its end (the transfer's variation
        that a wait for untraced members must exceed: absent_members.waited_for_members)."""
        ev = self.timeline.events
        return (ev["e_ns"] - ev["a_ns"]).to_numpy(dtype=np.float64)

    def stages(self) -> list[Cause]:
        """Each stage heavier than the others at their mean, replayed with every rank's
        persistent excess already removed (so a straggler does not count as its stage's)."""
        stage_of = self.role["stage"]
        if stage_of.nunique() < 2:
            return []
        leveled, baseline = self.leveled, self.leveled_saving
        # a stage's work is its time within steps: the time between steps (a loader, a
        # profiler writing its trace) is no stage's; a launch's time overlaps its chain's
        kind = self.timeline.events["kind"].to_numpy()
        within = ~np.isin(kind, [tl.Kind.START, tl.Kind.LAUNCH])  # summed: each time once
        in_step = kind != tl.Kind.START  # scaled: a launch's time too
        seg = leveled.seg_ns
        stage = stage_of.reindex(self.rank).to_numpy()
        # a stage's typical rank (the median): one straggler does not make its stage heavy
        per_rank = pd.DataFrame({"stage": stage, "rank": self.rank, "seg": seg * within}).groupby(
            ["stage", "rank"])["seg"].sum()  # fmt: skip
        per_stage = per_rank.groupby(level="stage").median()
        steps = float(self.ok.sum())
        causes = []
        for s, total in per_stage.items():
            mean = float(per_stage.drop(s).mean())  # the other stages: what this one should be
            if total <= mean:
                continue
            scaled = np.where((stage == s) & in_step, seg * (mean / total), seg)
            saved = self.saving(Durations(scaled, leveled.transfer_ns, leveled.post_ns))
            ranks = sorted(int(r) for r in stage_of[stage_of == s].index)
            evidence = {"stage_local_s": total / NS_PER_S / steps,
                        "mean_stage_local_s": mean / NS_PER_S / steps}  # fmt: skip
            label = f"pipeline stage {s}: more work than the other stages"
            # as a straggler's: beside the waits held for untraced members, where there are
            saved_ns = max(saved - baseline, self.held.beside(scaled, seg), 0.0)
            causes.append(self._cause(CauseKind.STAGE, label, saved_ns, ranks=ranks, stage=int(s),
                                      evidence=evidence))  # fmt: skip
        return causes

    # --- communication and schedule --------------------------------------------------------

    def _transfers_zeroed(self, mine: np.ndarray, keep_unsure: bool) -> float:
        """What the transfers of `mine` at zero save (waiting for untraced members kept; and
        with `keep_unsure`, the transfers that may be all such waiting, kept whole)."""
        kept = self.held.in_transfer_ns
        if keep_unsure:
            kept = np.where(self.held.unsure, self.base.transfer_ns, kept)
        zero = np.where(mine, kept, self.base.transfer_ns)
        return self.saving(Durations(self.base.seg_ns, zero, self.base.post_ns))

    def transfers(self) -> list[Cause]:
        groups = self.timeline.events["group"].to_numpy()
        kinds = self.timeline.events["kind"].to_numpy()
        moving = np.isin(kinds, [tl.Kind.SYNC, tl.Kind.LAUNCH, tl.Kind.RECV])
        causes = []
        for group in sorted(set(groups[moving]) - {""}):
            mine = moving & (groups == group)
            saved = self._transfers_zeroed(mine, keep_unsure=False)
            evidence = {}
            if (mine & self.held.unsure).any():
                low = self._transfers_zeroed(mine, keep_unsure=True)
                evidence["if_untraced_waited_s"] = low / NS_PER_S
            label = f"{group} communication (transfers, the waiting for peers excluded)"
            causes.append(self._cause(CauseKind.TRANSFER, label, saved, group=group,
                                      evidence=evidence))  # fmt: skip
        return causes

    def descheduled(self) -> list[Cause]:
        share = ds.shares_per_event(self.host_steps, self.rank, self.step)
        if share is not None:
            # a step's waiting for a core is measured inside its window: the time before it
            # opens (between steps: where a loader stall sits) is not shrunk by it
            before_step = self.timeline.events["kind"].to_numpy() == tl.Kind.START
            share = np.where(before_step, 0.0, share)
        ranks = [] if share is None else ds.waiting_ranks(self.rank, share)
        if share is None or not ranks:
            return []
        cores = ds.with_cores(self.base, share)
        saved = self.saving(cores)
        both = self.saving(Durations(cores.seg_ns, np.zeros_like(cores.transfer_ns), cores.post_ns))
        label = "the host: ranks waited for a core (more threads than cores, or other work)"
        return [self._cause(CauseKind.DESCHEDULED, label, saved, ranks=ranks, evidence={
            "waiting_for_a_core_share": float(share.mean()),
            "transfers_with_cores_s": max(both - saved, 0.0) / NS_PER_S})]  # fmt: skip

    def all_transfers(self) -> float:
        return self._transfers_zeroed(np.ones(len(self.base.transfer_ns), bool), False)

    def all_transfers_if_untraced_waited(self) -> float | None:
        """`all_transfers` with the transfers that may be waiting for untraced members kept
        (s; None where there are none)."""
        if not self.held.unsure.any():
            return None
        everything = np.ones(len(self.base.transfer_ns), dtype=bool)
        return self._transfers_zeroed(everything, keep_unsure=True) / NS_PER_S

    def schedule(self) -> list[Cause]:
        layout = self.run.manifest.layout
        p, m, v = layout.pp or 1, layout.microbatches or 1, layout.virtual_stages or 1
        if p < 2 or not self.run.manifest.schedule_known:  # m and v: unknown from traces
            return []
        now = ledger.bubble_fraction(p, m, v)
        best = min(ledger.bubble_fraction(p, 4 * m, v), ledger.bubble_fraction(p, m, max(v, 2)))
        saved = self.base_mean * (now - best) / max(1 - best, 1e-9)  # step = work / (1 - b)
        label = (
            f"pipeline bubble of the schedule (p={p}, m={m}, v={v}; {now:.0%} in theory, "
            f"{best:.0%} with 4x micro-batches or v=2)"
        )
        evidence = {"bubble_theory": now, "bubble_better": best}
        return [self._cause(CauseKind.SCHEDULE, label, saved, evidence=evidence)]

    def ideal(self) -> float:
        """The step with every local-time imbalance and every transfer removed."""
        seg = self.base.seg_ns
        level = np.minimum(seg, np.nan_to_num(self._seg_peer_median, nan=np.inf))
        zero = np.zeros_like(self.base.transfer_ns)
        times = step_times_ns(self.timeline, replay(self.timeline, Durations(level, zero, zero)))
        return float(times[self.ok].mean())
