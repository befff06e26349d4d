"""Where the step goes: counterfactual replays of the measured run, each with some durations
replaced, and the step time each would save (docs/metrics.md, "Attribution").

- a persistent straggler: one rank's local time at the median of its peers in the same role
  (same pipeline stage, same TP position), its typical excess removed from every step; also
  split into its compute and its host time (data loading, time outside any span);
- random imbalance: every rank's local time at its stage's mean in that step (the saving beyond
  what removing every rank's persistent excess saves: per-step noise, not one slow rank), and
  the bound if the variation is noise: every place at the quickest its stage ever did it;
- stage imbalance: each pipeline stage's local time at the mean of the other stages';
- communication: each group's transfers at zero (what communication itself costs, the
  waiting for late peers excluded), and at the ledger's bytes over the declared link bandwidth;
- the schedule: the theory bubble with 4x the micro-batches, or with 2 virtual stages;
- the host: every rank with its cores, its time waiting for one removed
  (diag/whatif/descheduled.py).

Each scenario is a method of `Scenarios` (diag/whatif/scenarios.py); this module runs them over
each reading of the steps and gathers the `Attribution`.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from diag.read.load import RunData
from diag.whatif import chunks
from diag.whatif import timeline as tl
from diag.whatif.causes import Attribution
from diag.whatif.replay import Durations, relative_ns, replay, step_times_ns
from diag.whatif.scenarios import (  # noqa: F401 (re-exported)
    MAX_CANDIDATES,
    MIN_EXCESS_SHARE,
    Scenarios,
)
from diag.whatif.waits import NS_PER_S, gaps_table, waits_table

__all__ = ["Attribution", "attribute", "attribution_summary", "own_gap_notes", "with_waits"]


def attribute(
    run: RunData,
    steps: pd.DataFrame,
    host: pd.DataFrame,
    replay_all: bool = False,
    memo: chunks.ReplayMemo | None = None,
) -> Attribution | None:
    """The attribution of the analysed `steps` (`host`: their waiting for a core,
    `diag.metrics.host.host_steps`), replayed in chunks of steps (diag/whatif/chunks.py: by
    default those whose records are in memory, within a budget; `replay_all`: every step);
    None when there is nothing to replay (fewer than two ranks, no steps, a layout nobody
    knows: `Manifest.layout_unknown`). `memo`: the chunks
    a growing run has replayed before, replayed again only when what they read has changed."""
    if steps.empty or steps["rank"].nunique() < 2 or run.manifest.layout_unknown:
        return None  # an unknown layout: which collectives are one, and who are peers, unknown
    plan = chunks.plan(run, steps, replay_all)
    replay = partial(attribute_chunk, host=host)
    if memo is None:
        found = chunks.replayed(run, steps, plan.chunks, replay, plan.chunk_events)
    else:
        found = memo.replayed(run, steps, host, plan, replay)
    parts = [part for part in found if part is not None]
    if not parts:
        return None
    if len(parts) > 1:
        attribution = chunks.combined(parts, plan.notes)
    else:
        attribution = parts[0].attribution  # a copy: the memo keeps the chunk's own
        attribution = dataclasses.replace(attribution, notes=plan.notes + attribution.notes)
    return dataclasses.replace(attribution, notes=attribution.notes + own_gap_notes(attribution))


OWN_GAP_SHARE = 0.10
"""A rank whose time in no record, read as its own work, exceeds this share of the step is
said: if it waited there for something nobody recorded, every cost misses that wait."""


def own_gap_notes(attribution: Attribution) -> list[str]:
    """One note per rank whose own time in gaps is above OWN_GAP_SHARE of the step; where
    part of it is in gaps whose reading is ambiguous, where those end and that the costs are
    ranges for it."""
    step = attribution.measured_step_s
    gaps = attribution.gaps
    if step <= 0 or gaps.empty:
        return []
    large = gaps[gaps["own_s"] > OWN_GAP_SHARE * step].sort_values("own_s", ascending=False)
    unsure = attribution.ambiguous
    notes = []
    for row in large.itertuples():
        share = row.own_s / step
        head = (f"rank {int(row.rank)}: {row.own_s * 1e3:.1f} ms per step ({share:.0%} of "
                "the step) in no record, read as its own work")  # fmt: skip
        mine = unsure[unsure["rank"] == row.rank] if not unsure.empty else unsure
        if mine.empty:
            notes.append(f"{head} (it resumed when no other rank's event could have released "
                         "it); if it waited there, the costs do not include that wait")  # fmt: skip
            continue
        largest = mine.sort_values("gap_s", ascending=False)
        where = ", ".join(f"{gap.gap_s * 1e3:.1f} ms before {gap.before}"
                          for gap in largest.itertuples())  # fmt: skip
        notes.append(f"{head}; of it, {where} may be waiting: its group's ranks resumed "
                     "there closer together than they arrived, though not together; the "
                     "costs are ranges, that time read as its own at one end and as waiting "
                     "for the last to arrive at the other")  # fmt: skip
    return notes


def attribute_chunk(
    run: RunData, records: RunData, steps: pd.DataFrame, host: pd.DataFrame
) -> chunks.Part | None:
    """The attribution of some steps, their spans and collectives read from `records`; where
    some gaps' reading is ambiguous (diag/whatif/untraced.py), with the attribution of the
    other reading, those gaps read as waiting, as its `alternative` (the costs' ranges)."""
    timeline, waiting = tl.readings(records, steps)
    part = _attributed(run, timeline, steps, host)
    if part is None or waiting is None:
        return part
    other = _attributed(run, waiting, steps, host)
    if other is None:
        return part
    steps_replayed = max(part.attribution.steps_replayed, 1)
    part.attribution.ambiguous = ambiguous_table(timeline.ambiguous, steps_replayed)
    part.attribution.alternative = other.attribution
    return part


def ambiguous_table(gaps: pd.DataFrame, steps: int) -> pd.DataFrame:
    """Per rank and what its gaps ended at, the time per step in gaps whose reading is
    ambiguous (rank, before, gap_s)."""
    if gaps.empty:
        return pd.DataFrame(columns=["rank", "before", "gap_s"])
    table = gaps.groupby(["rank", "before"], as_index=False, sort=True)["gap_ns"].sum()
    table["gap_s"] = table.pop("gap_ns").astype(np.float64) / NS_PER_S / max(steps, 1)
    return table


def _attributed(
    run: RunData, timeline: tl.Timeline, steps: pd.DataFrame, host: pd.DataFrame
) -> chunks.Part | None:
    """The attribution of one reading of the steps (`timeline`)."""
    base = Durations.measured(timeline)
    measured = step_times_ns(timeline, relative_ns(timeline))
    base_done = replay(timeline, base)
    replayed = step_times_ns(timeline, base_done)
    ok = np.isfinite(measured) & np.isfinite(replayed) & (measured > 0)
    if not ok.any():
        return None
    base_mean = float(replayed[ok].mean())
    errors = np.abs(replayed[ok] - measured[ok]) / measured[ok]
    scenarios = Scenarios(run, timeline, base, ok, base_mean, host,
                          base_done=base_done, replay_error=float(np.median(errors)))  # fmt: skip
    causes = scenarios.all()
    ideal = scenarios.ideal()
    attribution = Attribution(
        measured_step_s=float(measured[ok].mean()) / NS_PER_S,
        replayed_step_s=base_mean / NS_PER_S,
        replay_error=float(np.median(errors)),
        steps_replayed=int(ok.sum()),
        causes=sorted(causes, key=lambda c: -c.cost_s),
        ideal_step_s=ideal / NS_PER_S,
        all_transfers_s=scenarios.all_transfers() / NS_PER_S,
        transfers_if_untraced_waited_s=scenarios.all_transfers_if_untraced_waited(),
        untraced_unsure_ranks=scenarios.untraced_unsure_ranks(),
        balanced_s=scenarios.balanced / NS_PER_S,
        waits=waits_table(timeline, int(ok.sum())),
        notes=timeline.notes,
        gaps=gaps_table(timeline, int(ok.sum())),
    )
    return chunks.Part(attribution, errors)


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
