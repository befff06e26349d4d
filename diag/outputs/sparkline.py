"""A series as one line of text, for the text report: the step time over the analysed steps as
unicode block characters, so that a trend or a slow stretch can be seen in a terminal.

    step time  0.21 ▁▁▂▂▃▅▇█ 0.43 s (steps 1-40, median over ranks)

Long runs are downsampled to at most `MAX_MARKS` characters, each the slowest of its steps (one
slow step is never averaged away); the labels are the lowest and highest step of the series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from diag.outputs.units import num

BLOCKS = "▁▂▃▄▅▆▇█"
"""Eight heights, lowest first; a flat series is drawn at the middle height."""
GAP = " "
"""A mark with no measured value (NaN): a gap, never the lowest block."""
MAX_MARKS = 40
"""Characters at most in a sparkline."""


def sparkline(values: Sequence[float], max_marks: int = MAX_MARKS) -> str:
    """The values as block characters, lowest to highest over [min, max] of the values; more
    than `max_marks` values are split into `max_marks` runs of consecutive values (as equal as
    they divide) and each run drawn at its maximum. NaN is a gap; no finite value: all gaps."""
    if max_marks < 1:
        raise ValueError(f"max_marks must be at least 1, got {max_marks}")
    buckets = [_finite_max(chunk) for chunk in _chunks(list(values), max_marks)]
    finite = [v for v in buckets if v is not None]
    if not finite:
        return GAP * len(buckets)
    low, high = min(finite), max(finite)
    top = len(BLOCKS) - 1
    marks = []
    for value in buckets:
        if value is None:
            marks.append(GAP)
        elif high == low:
            marks.append(BLOCKS[top // 2])
        else:
            marks.append(BLOCKS[round((value - low) / (high - low) * top)])
    return "".join(marks)


def step_time_line(
    steps: Sequence[int],
    step_s: Sequence[float],
    statistic: str = "median over ranks",
    max_marks: int = MAX_MARKS,
) -> str | None:
    """`step time  0.21 ▁▂▅█ 0.43 s (steps 1-40, median over ranks)`: the sparkline of `step_s`
    (seconds, one per step of `steps`, in step order) between its lowest and highest value,
    what one value is (`statistic`), and when downsampled how many steps a mark covers.
    None when no step has a finite time."""
    if len(steps) != len(step_s):
        raise ValueError(f"{len(steps)} steps but {len(step_s)} step times")
    finite = [float(v) for v in step_s if math.isfinite(v)]
    if not finite:
        return None
    marks = sparkline(step_s, max_marks)
    per_mark = math.ceil(len(step_s) / len(marks))
    first, last = int(steps[0]), int(steps[-1])
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    slowest = f", each mark the slowest of up to {per_mark} steps" if per_mark > 1 else ""
    return (
        f"step time  {num(min(finite))} {marks} {num(max(finite))} s ({span}, {statistic}{slowest})"
    )


def median_step_times(rank_steps: pd.DataFrame) -> tuple[list[int], list[float]]:
    """Per analysed step (ascending), the median over ranks of the step's wall time (s), from
    `RunMetrics.rank_steps` (rank, step, wall_s)."""
    if rank_steps.empty:
        return [], []
    medians = rank_steps.groupby("step")["wall_s"].median().sort_index()
    return [int(s) for s in medians.index], [float(v) for v in medians.to_numpy()]


def rank_steps_line(rank_steps: pd.DataFrame, max_marks: int = MAX_MARKS) -> str | None:
    """`step_time_line` of the median over ranks of each analysed step's wall time."""
    steps, step_s = median_step_times(rank_steps)
    return step_time_line(steps, step_s, "median over ranks", max_marks)


def _chunks(values: list[float], count: int) -> list[list[float]]:
    """`values` in at most `count` runs of consecutive values, lengths differing by one at most."""
    if len(values) <= count:
        return [[v] for v in values]
    size, extra = divmod(len(values), count)
    out, start = [], 0
    for i in range(count):
        stop = start + size + (1 if i < extra else 0)
        out.append(values[start:stop])
        start = stop
    return out


def _finite_max(values: Sequence[float]) -> float | None:
    finite = [float(v) for v in values if math.isfinite(v)]
    return max(finite) if finite else None
