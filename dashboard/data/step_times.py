"""The step time over the analysed steps: its spread over the ranks per step, the ranks drawn
one by one, and what the findings say about the steps (an onset, a trend), for the step-time
chart of the Overview and the HTML report (`figures.step_time_over_steps`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dashboard.data.runs import LoadedRun

STEP_LINES_MAX = 8
"""Up to this many ranks every rank is a line of the step-time chart; above it the chart draws
the median and the min-max band over the ranks, and the first blamed ranks (this many at most)
as lines: a 1,024-rank run is three traces and a few lines, not 1,024 lines."""
ONSET_KEYS = {"from_step": "from step", "first_step": "from step"}
"""Evidence fields that name the step from which a finding holds (HST001: the waiting for a core
began; PIT003: the loss became NaN), and how the chart words them."""
TREND_RULE = "TRD001"
"""The rule whose evidence holds a slope of the step time (`slope_s_per_step`, `growth`,
`steps`), fitted to the slowest rank's wall time per step."""


def step_spread(rank_steps: pd.DataFrame) -> pd.DataFrame:
    """Per analysed step (ascending) the wall time over the ranks (`RunMetrics.rank_steps`):
    step, median_s, min_s, max_s, max_rank (the slowest rank, the lowest on a tie) and ranks
    (how many ranks have a wall time at that step)."""
    columns = ["step", "median_s", "min_s", "max_s", "max_rank", "ranks"]
    if rank_steps.empty:
        return pd.DataFrame(columns=columns)
    walls = rank_steps[["rank", "step", "wall_s"]].dropna(subset=["wall_s"])
    by_step = walls.groupby("step")["wall_s"]
    slowest = walls.sort_values(["wall_s", "rank"], ascending=[False, True], kind="stable")
    slowest = slowest.drop_duplicates("step").set_index("step")["rank"]
    spread = pd.DataFrame({
        "median_s": by_step.median(), "min_s": by_step.min(), "max_s": by_step.max(),
        "max_rank": slowest.astype("int64"), "ranks": by_step.size(),
    })  # fmt: skip
    return spread.sort_index().rename_axis("step").reset_index()[columns]


def line_ranks(rank_steps: pd.DataFrame, blamed: Sequence[int]) -> list[int]:
    """The ranks the chart draws as lines: every rank up to STEP_LINES_MAX ranks, else the
    blamed ranks that have analysed steps (first blamed first, STEP_LINES_MAX at most)."""
    ranks = sorted(int(r) for r in rank_steps["rank"].unique()) if not rank_steps.empty else []
    if len(ranks) <= STEP_LINES_MAX:
        return ranks
    present = set(ranks)
    return [r for r in blamed if r in present][:STEP_LINES_MAX]


def rank_lines(rank_steps: pd.DataFrame, ranks: Sequence[int]) -> pd.DataFrame:
    """rank, step, wall_s of `ranks`, by rank then step."""
    lines = rank_steps.loc[rank_steps["rank"].isin(list(ranks)), ["rank", "step", "wall_s"]]
    return lines.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Onset:
    """A finding that holds from a step to the end of the run."""

    rule: str
    step: int
    label: str  # "HST001 from step 12"


@dataclass(frozen=True)
class Trend:
    """A finding's slope of the step time (TRD001), fitted to the slowest rank per step."""

    rule: str
    slope_s_per_step: float
    label: str  # "TRD001 trend: +43% over 40 steps"


@dataclass(frozen=True)
class StepMarks:
    """What the findings say about the steps, in the findings' order."""

    onsets: list[Onset]
    trends: list[Trend]


def step_marks(findings: Iterable[Mapping[str, Any]], steps: Sequence[int]) -> StepMarks:
    """The onsets and trends of the report's findings (`report["findings"]`) that fall on the
    analysed `steps`: an onset after the last analysed step, or a trend over fewer than two
    steps, has nothing to mark."""
    onsets: list[Onset] = []
    trends: list[Trend] = []
    last = max(steps, default=None)
    for finding in findings:
        rule, evidence = str(finding.get("rule")), finding.get("evidence") or {}
        for key, words in ONSET_KEYS.items():
            step = evidence.get(key)
            if isinstance(step, int) and last is not None and step <= last:
                onsets.append(Onset(rule, step, f"{rule} {words} {step}"))
                break
        slope = evidence.get("slope_s_per_step")
        if rule == TREND_RULE and isinstance(slope, int | float) and len(steps) >= 2:
            growth, count = evidence.get("growth"), evidence.get("steps")
            over = f" over {count} steps" if isinstance(count, int) else ""
            grows = f"{growth:+.0%}{over}" if isinstance(growth, int | float) else "rising"
            trends.append(Trend(rule, float(slope), f"{rule} trend: {grows}"))
    return StepMarks(onsets, trends)


@dataclass(frozen=True)
class StepTimes:
    """What the step-time chart draws of a run."""

    spread: pd.DataFrame  # step_spread
    lines: pd.DataFrame  # rank_lines of line_ranks
    blamed: list[int]  # LoadedRun.blamed_ranks
    marks: StepMarks


def step_times(loaded: LoadedRun) -> StepTimes | None:
    """The step-time chart's data of a run; None without an analysed step."""
    rank_steps = loaded.metrics.rank_steps
    spread = step_spread(rank_steps)
    if spread.empty:
        return None
    blamed = loaded.blamed_ranks
    lines = rank_lines(rank_steps, line_ranks(rank_steps, blamed))
    marks = step_marks(loaded.report["findings"], [int(s) for s in spread["step"]])
    return StepTimes(spread, lines, blamed, marks)
