"""The text report's step-time sparkline: heights over [min, max], gaps for missing values,
downsampling that keeps a slow step, and the line's labels and units."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from diag.outputs.sparkline import (
    BLOCKS,
    GAP,
    MAX_MARKS,
    median_step_times,
    rank_steps_line,
    sparkline,
    step_time_line,
)


def test_heights_run_from_the_lowest_to_the_highest_block() -> None:
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == BLOCKS
    assert sparkline([8.0, 1.0]) == BLOCKS[-1] + BLOCKS[0]
    assert sparkline([0.2, 0.2, 0.2]) == BLOCKS[3] * 3  # flat: the middle, not the floor


def test_a_missing_value_is_a_gap_not_the_floor() -> None:
    line = sparkline([1.0, math.nan, 2.0])
    assert line == BLOCKS[0] + GAP + BLOCKS[-1]
    assert sparkline([math.nan, math.nan]) == GAP * 2


def test_long_series_are_downsampled_and_keep_the_slow_step() -> None:
    values = [0.1] * 400
    values[123] = 0.9  # one slow step among 400
    line = sparkline(values)
    assert len(line) == MAX_MARKS
    assert line.count(BLOCKS[-1]) == 1 and line.index(BLOCKS[-1]) == 123 // 10
    assert len(sparkline(list(range(41)), max_marks=40)) == 40
    assert len(sparkline(list(range(7)), max_marks=3)) == 3
    with pytest.raises(ValueError, match="max_marks"):
        sparkline([1.0], max_marks=0)


def test_the_line_labels_min_max_units_steps_and_statistic() -> None:
    steps = list(range(1, 41))
    seconds = [0.21 + 0.22 * i / 39 for i in range(40)]
    line = step_time_line(steps, seconds)
    assert line is not None
    assert line.startswith("step time  0.21 ▁")
    assert line.endswith("█ 0.43 s (steps 1-40, median over ranks)")
    marks = line.split()[3]
    assert len(marks) == 40 and list(marks) == sorted(marks)  # rising: never lower again


def test_a_downsampled_line_says_how_many_steps_a_mark_covers() -> None:
    line = step_time_line(list(range(100)), [1.0 + (i % 7) for i in range(100)], "slowest rank")
    assert line is not None
    assert "(steps 0-99, slowest rank, each mark the slowest of up to 3 steps)" in line
    assert len(line.split()[3]) == MAX_MARKS


def test_no_finite_step_time_is_no_line() -> None:
    assert step_time_line([], []) is None
    assert step_time_line([1, 2], [math.nan, math.nan]) is None
    assert (
        step_time_line([3], [0.5])
        == f"step time  0.5 {BLOCKS[3]} 0.5 s (step 3, median over ranks)"
    )
    with pytest.raises(ValueError, match="2 steps but 1"):
        step_time_line([1, 2], [0.5])


def test_the_line_of_a_runs_rank_steps_is_the_median_over_ranks() -> None:
    rank_steps = pd.DataFrame({
        "rank": [0, 1, 2, 0, 1, 2], "step": [2, 2, 2, 1, 1, 1],
        "wall_s": [0.4, 0.5, 0.9, 0.1, 0.2, 0.3],
    })  # fmt: skip
    assert median_step_times(rank_steps) == ([1, 2], [0.2, 0.5])
    assert rank_steps_line(rank_steps) == (
        f"step time  0.2 {BLOCKS[0]}{BLOCKS[-1]} 0.5 s (steps 1-2, median over ranks)"
    )
    assert rank_steps_line(rank_steps.iloc[0:0]) is None


def test_the_text_report_shows_the_step_time_under_its_headline(tmp_path) -> None:
    from benchmarks.synthetic_run import write_synthetic_run
    from diag.api import analyze_path
    from diag.outputs.report import render_text

    report = analyze_path(write_synthetic_run(tmp_path / "run", ranks=4, steps=8))
    line = render_text(report).splitlines()[1]
    assert line == report["summary"]["step_time_line"]
    assert line.startswith("step time  ") and line.endswith("s (steps 1-7, median over ranks)")
