"""What every analysis of the metrics shares: the (rank, step) keys, units, and which steps are
analysed (each rank's warm-up step dropped)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diag.numeric.keys import KEYS, in_steps, rank_steps_in  # noqa: F401 (re-exported)
from diag.numeric.ordering import run_starts
from diag.read.load import RunData

NS_PER_S = 1e9
WARMUP_MIN_STEPS = 3
"""A rank with at least this many step records has its first step excluded as warm-up."""


def analysed_steps(steps: pd.DataFrame, warmup: bool = True) -> tuple[pd.DataFrame, int]:
    """Step records left after dropping each rank's warm-up step (when the records start at
    the run's start: `warmup`), and the warm-up step count."""
    order = rank_step_order(steps)
    ranks, numbers = steps["rank"].to_numpy()[order], steps["step"].to_numpy()[order]
    if not warmup or len(order) == 0:
        return steps.take(order).reset_index(drop=True), 0
    starts = run_starts(ranks)
    sizes = np.diff(np.r_[starts, len(ranks)])
    first = np.repeat(numbers[starts], sizes)  # each row's rank's first (lowest) step
    dropped = (np.repeat(sizes, sizes) >= WARMUP_MIN_STEPS) & (numbers == first)
    warmup_steps = len(np.unique(numbers[dropped]))
    return steps.take(order[~dropped]).reset_index(drop=True), warmup_steps


def rank_step_order(frame: pd.DataFrame) -> np.ndarray:
    """The positions of `frame`'s rows in (rank, step) order, ties in row order: what
    `sort_values(KEYS, kind="stable")` sorts by, as two stable sorts (step, then rank: a radix
    sort where the ranks fit 16 bits; none where the rows are in either order already)."""
    ranks, steps = frame["rank"].to_numpy(), frame["step"].to_numpy()
    if in_rank_step_order(frame):
        return np.arange(len(ranks))
    by_step = np.arange(len(ranks))
    if not (steps[1:] >= steps[:-1]).all():
        by_step = np.argsort(steps, kind="stable")
        ranks = ranks[by_step]
    if len(ranks) and ranks.min() >= 0 and ranks.max() < 2**16:
        ranks = ranks.astype(np.uint16)
    return by_step[np.argsort(ranks, kind="stable")]


def in_rank_step_order(frame: pd.DataFrame) -> bool:
    """Whether `frame`'s rows are in (rank, step) order already (a stable sort keeps them)."""
    ranks, steps = frame["rank"].to_numpy(), frame["step"].to_numpy()
    after = (ranks[1:] > ranks[:-1]) | ((ranks[1:] == ranks[:-1]) & (steps[1:] >= steps[:-1]))
    return bool(after.all())


def ratio(numerator: Any, denominator: Any) -> float | None:
    if pd.isna(numerator) or pd.isna(denominator) or denominator == 0:
        return None
    return float(numerator) / float(denominator)


def note_orphans(run: RunData, skipped: list[str]) -> None:
    if run.steps.empty:
        skipped.append("no step records in any rank file: no step could be analysed")
    orphans = [frame[KEYS][~in_steps(frame, run.steps)] for frame in (run.spans, run.comms)]
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
