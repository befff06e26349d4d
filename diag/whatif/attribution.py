"""Where the step goes: counterfactual replays of the measured run, each with some durations
replaced, and the step time each would save (docs/metrics.md, "Attribution").

- a persistent straggler: one rank's local time at the median of its peers in the same role
  (same pipeline stage, same TP position), its typical excess removed from every step; also
  split into its compute and its host time (data loading, time outside any span);
- random imbalance: every rank's local time at that step's peer median (the saving beyond what
  removing every rank's persistent excess saves: per-step noise, not one slow rank);
- stage imbalance: each pipeline stage's local time at the mean of the other stages';
- communication: each group's transfers at zero (what communication itself costs, the
  waiting for late peers excluded), and at the ledger's bytes over the declared link bandwidth;
- the schedule: the theory bubble with 4x the micro-batches, or with 2 virtual stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from diag import ledger
from diag.load import RunData
from diag.roles import rank_roles
from diag.whatif import timeline as tl
from diag.whatif.replay import Durations, relative_ns, replay, step_times_ns

NS_PER_S = 1e9
MAX_CANDIDATES = 4
"""Ranks whose persistent excess is replayed one by one (the largest excesses)."""
MAX_EVENTS = 150_000
"""Events replayed at most (steps are dropped from the end beyond): the replay is a Python loop."""
MIN_EXCESS_SHARE = 0.01
"""A rank whose typical excess is below this share of the step is no straggler candidate."""


@dataclass
class Cause:
    """One counterfactual: what it changes, and the step time it saves (s per step)."""

    kind: str  # straggler | host | imbalance | stage | transfer | schedule
    label: str
    cost_s: float
    cost_share: float
    ranks: list[int] = field(default_factory=list)
    stage: int | None = None
    group: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Attribution:
    """The step of a run, attributed: the measured and replayed step, the causes by cost, and
    per rank and group the split of waiting into arrival skew and transfer."""

    measured_step_s: float
    replayed_step_s: float
    replay_error: float
    steps_replayed: int
    causes: list[Cause]
    ideal_step_s: float
    all_transfers_s: float
    """What every transfer at zero saves at once (the communication findings' cost)."""
    balanced_s: float
    """What every rank's local time at its peers' median in every step saves: all imbalance,
    persistent and random."""
    waits: pd.DataFrame
    """rank, group, skew_s, transfer_s (per step), last_share (of its group's collectives
    that this rank arrived at last)."""
    notes: list[str] = field(default_factory=list)

    def cause(self, kind: str, **match: Any) -> Cause | None:
        for cause in self.causes:
            if cause.kind == kind and all(getattr(cause, k) == v for k, v in match.items()):
                return cause
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured_step_s": self.measured_step_s,
            "replayed_step_s": self.replayed_step_s,
            "replay_error": self.replay_error,
            "steps_replayed": self.steps_replayed,
            "ideal_step_s": self.ideal_step_s,
            "all_transfers_s": self.all_transfers_s,
            "balanced_s": self.balanced_s,
            "causes": [vars(c) for c in self.causes],
            "waits": self.waits.to_dict("records"),
            "notes": self.notes,
        }


def attribute(run: RunData, steps: pd.DataFrame) -> Attribution | None:
    """The attribution of the analysed `steps`; None when there is nothing to replay (fewer
    than two ranks, no steps)."""
    if steps.empty or steps["rank"].nunique() < 2:
        return None
    steps, notes = _window(run, steps)
    timeline = tl.build(run, steps)
    base = Durations.measured(timeline)
    measured = step_times_ns(timeline, relative_ns(timeline))
    replayed = step_times_ns(timeline, replay(timeline, base))
    ok = np.isfinite(measured) & np.isfinite(replayed) & (measured > 0)
    if not ok.any():
        return None
    base_mean = float(replayed[ok].mean())
    error = float(np.median(np.abs(replayed[ok] - measured[ok]) / measured[ok]))
    scenarios = _Scenarios(run, timeline, base, ok, base_mean)
    causes = scenarios.all()
    ideal = scenarios.ideal()
    return Attribution(
        measured_step_s=float(measured[ok].mean()) / NS_PER_S,
        replayed_step_s=base_mean / NS_PER_S,
        replay_error=error,
        steps_replayed=int(ok.sum()),
        causes=sorted(causes, key=lambda c: -c.cost_s),
        ideal_step_s=ideal / NS_PER_S,
        all_transfers_s=scenarios.all_transfers() / NS_PER_S,
        balanced_s=scenarios.balanced / NS_PER_S,
        waits=_waits(timeline, int(ok.sum())),
        notes=notes + timeline.notes,
    )


def _window(run: RunData, steps: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The first analysed steps that keep the replay under MAX_EVENTS events."""
    per_step = (len(run.comms) + len(run.spans) / 4 + 2 * len(run.steps)) / max(len(steps), 1)
    keep = max(2, int(MAX_EVENTS / max(per_step * steps["rank"].nunique(), 1)))
    order = np.sort(steps["step"].unique())
    if len(order) <= keep:
        return steps, []
    chosen = steps[steps["step"].isin(order[:keep])]
    return chosen, [f"attribution replays the first {keep} of {len(order)} analysed steps"]


class _Scenarios:
    """The counterfactual replays of one timeline."""

    def __init__(
        self, run: RunData, timeline: tl.Timeline, base: Durations, ok: np.ndarray, base_mean: float
    ) -> None:
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
        self.role = rank_roles(run, timeline.ranks)
        self.peer_median = _peer_medians(ev, self.role)
        self.stage_mean = _stage_means(ev, self.role)
        self.balanced = 0.0  # set by `imbalance`

    def saving(self, durations: Durations) -> float:
        times = step_times_ns(self.timeline, replay(self.timeline, durations))
        return max(self.base_mean - float(times[self.ok].mean()), 0.0)

    def _cause(self, kind: str, label: str, saved_ns: float, **fields: Any) -> Cause:
        return Cause(kind, label, saved_ns / NS_PER_S, saved_ns / self.base_mean, **fields)

    def all(self) -> list[Cause]:
        causes = [*self.stragglers(), *self.imbalance(), *self.stages(), *self.transfers()]
        causes += self.schedule()
        return [c for c in causes if c.cost_s > 0]

    # --- local time ------------------------------------------------------------------------

    def _excess(self, part: np.ndarray) -> np.ndarray:
        """Per event, the typical (median over steps) excess of its rank's local time `part`
        at this position of the step over its peers' median."""
        over = part - self.peer_median(part)
        frame = pd.DataFrame({"rank": self.rank, "j": self.j, "over": over})
        typical = frame.groupby(["rank", "j"])["over"].transform("median").to_numpy()
        return np.clip(np.nan_to_num(typical), 0, None)

    def _without(self, ranks: list[int], part: str) -> Durations:
        seg = self.base.seg_ns
        host = np.minimum(self.host, seg)
        pieces = {"all": seg, "host": host, "compute": seg - host}
        excess = np.minimum(self._excess(pieces[part]), pieces[part])
        mine = np.isin(self.rank, ranks)
        return Durations(seg - np.where(mine, excess, 0), self.base.transfer_ns, self.base.post_ns)

    @cached_property
    def leveled(self) -> Durations:
        """Every rank's persistent excess removed (the imbalance and stage replays share it)."""
        return self._without(list(self.timeline.ranks), "all")

    @cached_property
    def leveled_saving(self) -> float:
        return self.saving(self.leveled)

    def stragglers(self) -> list[Cause]:
        seg = self.base.seg_ns
        excess = self._excess(seg)
        per_rank = pd.Series(excess).groupby(self.rank).sum() / max(int(self.ok.sum()), 1)
        candidates = per_rank[per_rank > MIN_EXCESS_SHARE * self.base_mean].nlargest(
            MAX_CANDIDATES
        )  # fmt: skip
        causes = []
        for rank in candidates.index:
            saved = self.saving(self._without([int(rank)], "all"))
            host = self.saving(self._without([int(rank)], "host"))
            compute = self.saving(self._without([int(rank)], "compute"))
            kind = "host" if host > compute else "straggler"
            if kind == "host":
                label = f"rank {rank}: host time (data loading, work outside the recorded spans)"
            else:
                label = f"rank {rank}: slower compute than its peers"
            causes.append(self._cause(kind, label, saved, ranks=[int(rank)], evidence={
                "host_saving_s": host / NS_PER_S, "compute_saving_s": compute / NS_PER_S,
                "typical_excess_per_step_s": float(candidates[rank]) / NS_PER_S,
            }))  # fmt: skip
        return causes

    def imbalance(self) -> list[Cause]:
        """Random imbalance: with every rank's persistent excess removed, each rank's local time
        at each place of each step replaced by the mean over its stage's ranks (the ranks of
        one stage do the same work; balancing data or sequence lengths moves work between them
        and deletes none, so the mean, not the fastest rank, is what balance would give)."""
        leveled, persistent = self.leveled, self.leveled_saving
        seg = leveled.seg_ns
        mean = self.stage_mean(seg)
        even = Durations(np.where(np.isnan(mean), seg, mean), leveled.transfer_ns, leveled.post_ns)
        per_step = self.saving(even)
        self.balanced = max(per_step, persistent)  # all imbalance: at least the persistent
        random_part = max(per_step - persistent, 0.0)
        return [self._cause("imbalance", "random per-step imbalance across ranks (data or "
                            "sequence lengths, jitter)", random_part, evidence={
                                "every_step_balanced_s": per_step / NS_PER_S,
                                "persistent_excess_removed_s": persistent / NS_PER_S})]  # fmt: skip

    def stages(self) -> list[Cause]:
        """Each stage heavier than the others at their mean, replayed with every rank's
        persistent excess already removed (so a straggler does not count as its stage's)."""
        stage_of = self.role["stage"]
        if stage_of.nunique() < 2:
            return []
        leveled, baseline = self.leveled, self.leveled_saving
        seg = leveled.seg_ns
        stage = stage_of.reindex(self.rank).to_numpy()
        # a stage's typical rank (the median): one straggler does not make its stage heavy
        per_rank = pd.DataFrame({"stage": stage, "rank": self.rank, "seg": seg}).groupby(
            ["stage", "rank"])["seg"].sum()  # fmt: skip
        per_stage = per_rank.groupby(level="stage").median()
        steps = float(self.ok.sum())
        causes = []
        for s, total in per_stage.items():
            mean = float(per_stage.drop(s).mean())  # the other stages: what this one should be
            if total <= mean:
                continue
            scaled = np.where(stage == s, seg * (mean / total), seg)
            saved = self.saving(Durations(scaled, leveled.transfer_ns, leveled.post_ns))
            ranks = sorted(int(r) for r in stage_of[stage_of == s].index)
            evidence = {"stage_local_s": total / NS_PER_S / steps,
                        "mean_stage_local_s": mean / NS_PER_S / steps}  # fmt: skip
            label = f"pipeline stage {s}: more work than the other stages"
            causes.append(self._cause("stage", label, max(saved - baseline, 0.0), ranks=ranks,
                                      stage=int(s), evidence=evidence))  # fmt: skip
        return causes

    # --- communication and schedule --------------------------------------------------------

    def transfers(self) -> list[Cause]:
        groups = self.timeline.events["group"].to_numpy()
        kinds = self.timeline.events["kind"].to_numpy()
        moving = np.isin(kinds, [tl.Kind.SYNC, tl.Kind.LAUNCH, tl.Kind.RECV])
        causes = []
        for group in sorted(set(groups[moving]) - {""}):
            mine = moving & (groups == group)
            zero = np.where(mine, 0.0, self.base.transfer_ns)
            saved = self.saving(Durations(self.base.seg_ns, zero, self.base.post_ns))
            label = f"{group} communication (transfers, the waiting for peers excluded)"
            causes.append(self._cause("transfer", label, saved, group=group))
        return causes

    def all_transfers(self) -> float:
        zero = np.zeros_like(self.base.transfer_ns)
        return self.saving(Durations(self.base.seg_ns, zero, self.base.post_ns))

    def schedule(self) -> list[Cause]:
        layout = self.run.manifest.layout
        p, m, v = layout.pp or 1, layout.microbatches or 1, layout.virtual_stages or 1
        if p < 2:
            return []
        now = ledger.bubble_fraction(p, m, v)
        best = min(ledger.bubble_fraction(p, 4 * m, v), ledger.bubble_fraction(p, m, max(v, 2)))
        saved = self.base_mean * (now - best) / max(1 - best, 1e-9)  # step = work / (1 - b)
        label = (
            f"pipeline bubble of the schedule (p={p}, m={m}, v={v}; {now:.0%} in theory, "
            f"{best:.0%} with 4x micro-batches or v=2)"
        )
        evidence = {"bubble_theory": now, "bubble_better": best}
        return [self._cause("schedule", label, saved, evidence=evidence)]

    def ideal(self) -> float:
        """The step with every local-time imbalance and every transfer removed."""
        seg = self.base.seg_ns
        level = np.minimum(seg, np.nan_to_num(self.peer_median(seg), nan=np.inf))
        zero = np.zeros_like(self.base.transfer_ns)
        times = step_times_ns(self.timeline, replay(self.timeline, Durations(level, zero, zero)))
        return float(times[self.ok].mean())


def _peer_medians(events: pd.DataFrame, role: pd.DataFrame):
    """A function: for values per event, the median of the same (step, position) over the
    other ranks of the event's role (NaN where the rank has no peer there)."""
    roles = role["role"].reindex(events["rank"].to_numpy()).to_numpy()
    keys = pd.MultiIndex.from_arrays([roles, events["step"].to_numpy(), events["j"].to_numpy()])
    codes, _ = pd.factorize(keys)

    def median_of_others(values: np.ndarray) -> np.ndarray:
        frame = pd.DataFrame({"key": codes, "v": values})
        count = frame.groupby("key")["v"].transform("size").to_numpy()
        ranked = frame.groupby("key")["v"].rank(method="first").to_numpy()
        median_all = frame.groupby("key")["v"].transform("median").to_numpy()
        # the median of the others: for two members, the other one's value
        total = frame.groupby("key")["v"].transform("sum").to_numpy()
        out = np.where(count == 2, total - values, median_all)
        out = np.where(count >= 3, _median_without(frame, ranked, count), out)
        return np.where(count < 2, np.nan, out)

    return median_of_others


def _stage_means(events: pd.DataFrame, role: pd.DataFrame) -> Callable[[np.ndarray], np.ndarray]:
    """A function: for values per event, the mean of the same (step, place) over the ranks of
    the event's pipeline stage (NaN where the rank is alone there)."""
    stages = role["stage"].reindex(events["rank"].to_numpy()).to_numpy()
    keys = pd.MultiIndex.from_arrays([stages, events["step"].to_numpy(), events["j"].to_numpy()])
    codes, _ = pd.factorize(keys)

    def mean_of_stage(values: np.ndarray) -> np.ndarray:
        grouped = pd.Series(values).groupby(codes)
        count = grouped.transform("size").to_numpy()
        return np.where(count < 2, np.nan, grouped.transform("mean").to_numpy())

    return mean_of_stage


def _median_without(frame: pd.DataFrame, ranked: np.ndarray, count: np.ndarray) -> np.ndarray:
    """For groups of 3 or more, the median of the group without each member (by its rank in
    the sorted group: removing a value below the median shifts the median up by half a place)."""
    ordered = frame.assign(r=ranked).sort_values(["key", "r"], kind="stable")
    values = ordered["v"].to_numpy()
    starts = ordered.groupby("key", sort=False).cumcount().to_numpy()
    base = np.arange(len(values)) - starts  # index of each group's first value
    n = count[ordered.index.to_numpy()]
    r = ranked[ordered.index.to_numpy()].astype(int) - 1
    m = n - 1  # size without the member

    def at(i: np.ndarray) -> np.ndarray:  # the i-th of the group without the member
        i = i + (i >= r)
        return values[base + np.minimum(i, n - 1)]

    low, high = at((m - 1) // 2), at(m // 2)
    out = np.empty(len(values))
    out[ordered.index.to_numpy()] = (low + high) / 2
    return out


def _waits(timeline: tl.Timeline, steps: int) -> pd.DataFrame:
    """Per rank and group, the measured waiting split into arrival skew (before the last
    member arrived or the send started) and transfer, per step; how often it arrived last."""
    ev = timeline.events
    kind = ev["kind"].to_numpy()
    a, e = ev["a_ns"].to_numpy(dtype=np.float64), ev["e_ns"].to_numpy(dtype=np.float64)
    rows = []
    last_arrival: dict[int, float] = {}
    for inst, members in timeline.members.items():
        last_arrival[inst] = float(a[members].max())
    instance = ev["instance"].to_numpy()
    for k in np.flatnonzero(np.isin(kind, [tl.Kind.SYNC, tl.Kind.RECV, tl.Kind.WAIT])):
        if kind[k] == tl.Kind.SYNC:
            ready, group = last_arrival[int(instance[k])], ev["group"].iat[k]
        elif kind[k] == tl.Kind.RECV:
            ready, group = a[int(ev["sender"].iat[k])], ev["group"].iat[k]
        else:
            awaited = timeline.waits_on[int(k)]
            ready = max(last_arrival[int(instance[w])] for w in awaited)
            group = ev["group"].iat[awaited[0]]
        wait = max(e[k] - a[k], 0.0)
        skew = min(max(ready - a[k], 0.0), wait)
        rows.append((int(ev["rank"].iat[k]), group, skew, wait - skew))
    frame = pd.DataFrame(rows, columns=["rank", "group", "skew_ns", "transfer_ns"])
    last = []
    for inst, members in timeline.members.items():
        latest = members[int(np.argmax(a[members]))]
        last.append((int(ev["rank"].iat[latest]), ev["group"].iat[latest], inst))
    lasts = pd.DataFrame(last, columns=["rank", "group", "instance"])
    counts = lasts.groupby(["rank", "group"]).size()
    totals = lasts.groupby("group").size()
    if frame.empty:
        return pd.DataFrame(columns=["rank", "group", "skew_s", "transfer_s", "last_share"])
    table = frame.groupby(["rank", "group"])[["skew_ns", "transfer_ns"]].sum().reset_index()
    table["skew_s"] = table.pop("skew_ns") / NS_PER_S / max(steps, 1)
    table["transfer_s"] = table.pop("transfer_ns") / NS_PER_S / max(steps, 1)
    table["last_share"] = [
        counts.get((r, g), 0) / totals.get(g, 1)
        for r, g in zip(table["rank"], table["group"], strict=True)
    ]
    return table


def with_waits(ranks: pd.DataFrame, attribution: Attribution) -> pd.DataFrame:
    """The rank table with each rank's waiting per step split into arrival skew and transfer
    (`skew_s`, `transfer_s`, over all its groups)."""
    waits = attribution.waits.groupby("rank")[["skew_s", "transfer_s"]].sum()
    table = ranks.join(waits, on="rank")
    for column in ("skew_s", "transfer_s"):  # no waits at all: an object column of nulls
        table[column] = pd.to_numeric(table[column], errors="coerce").fillna(0.0).astype(float)
    return table


def attribution_summary(attribution: Attribution) -> dict[str, Any]:
    """The headline of the attribution: exposed waiting split into skew and transfer (shares
    of the step, averaged over ranks), the replay error and the ideal step."""
    step = attribution.measured_step_s
    per_rank = attribution.waits.groupby("rank")[["skew_s", "transfer_s"]].sum()
    return {
        "exposed_skew_share": float(per_rank["skew_s"].mean()) / step if step > 0 else None,
        "exposed_transfer_share": (
            float(per_rank["transfer_s"].mean()) / step if step > 0 else None
        ),
        "replay_error": attribution.replay_error,
        "ideal_step_s": attribution.ideal_step_s,
    }
