"""What every analysis of the metrics shares: the (rank, step) keys, units, and which steps are
analysed (each rank's warm-up step dropped)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from diag.numeric.keys import KEYS, in_steps, rank_steps_in  # noqa: F401 (re-exported)
from diag.read.load import RunData

NS_PER_S = 1e9
WARMUP_MIN_STEPS = 3
"""A rank with at least this many step records has its first step excluded as warm-up."""


def analysed_steps(steps: pd.DataFrame, warmup: bool = True) -> tuple[pd.DataFrame, int]:
    """Step records left after dropping each rank's warm-up step (when the records start at
    the run's start: `warmup`), and the warm-up step count."""
    steps = steps.sort_values(KEYS, kind="stable")
    if not warmup:
        return steps.reset_index(drop=True), 0
    by_rank = steps.groupby("rank")["step"]
    warmup = (by_rank.transform("size") >= WARMUP_MIN_STEPS) & (
        steps["step"] == by_rank.transform("min")
    )
    warmup_steps = int(steps.loc[warmup, "step"].nunique())
    return steps.loc[~warmup].reset_index(drop=True), warmup_steps


def ratio(numerator: Any, denominator: Any) -> float | None:
    if pd.isna(numerator) or pd.isna(denominator) or denominator == 0:
        return None
    return float(numerator) / float(denominator)


def note_orphans(run: RunData, skipped: list[str]) -> None:
    if run.steps.empty:
        skipped.append("no step records in any rank file: no step could be analysed")
    known = pd.MultiIndex.from_frame(run.steps[KEYS])
    orphans = [
        frame[KEYS][~pd.MultiIndex.from_frame(frame[KEYS]).isin(known)]
        for frame in (run.spans, run.comms)
    ]
    lost = pd.concat(orphans)
    if len(lost):
        files = _file_list(lost["rank"], run.rank_file_name)
        skipped.append(
            f"{files}: {len(lost)} span/comm records of steps without a step record ignored "
            f"(steps {_short_list(lost['step'])})"
        )


def note_unrecorded_sync(run: RunData, skipped: list[str]) -> None:
    """A note per reason the collectors gave for gradient synchronisation they could not
    record (`grad_sync_unrecorded` events): the communication findings lack those bytes."""
    events = run.events
    if events.empty or "fields" not in events:
        return
    unrecorded = events[events["name"] == "grad_sync_unrecorded"]
    reasons: dict[str, set[int]] = {}
    for rank, fields in zip(unrecorded["rank"], unrecorded["fields"], strict=True):
        reason = fields.get("reason") if isinstance(fields, dict) else None
        reasons.setdefault(str(reason or "no reason given"), set()).add(int(rank))
    for reason, ranks in sorted(reasons.items()):
        files = _file_list(pd.Series(sorted(ranks)), run.rank_file_name)
        skipped.append(
            f"{files}: the data-parallel gradient synchronisation was not recorded ({reason}): "
            "its collectives are missing from the communication figures and findings"
        )


def _file_list(ranks: pd.Series, named: Callable[[int], str]) -> str:
    names = [named(int(r)) for r in sorted(ranks.unique())]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _short_list(values: pd.Series) -> str:
    items = [str(int(v)) for v in sorted(values.unique())]
    return ", ".join(items[:5]) + (f", ... ({len(items)} in all)" if len(items) > 5 else "")
