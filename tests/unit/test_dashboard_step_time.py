"""The step time over the steps (Overview, HTML report) without a browser: the spread over the
ranks per step, which ranks are lines (every rank of a small run; the blamed ones of a large run,
over the median and min-max band), and the findings' onsets and trends as marks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard import figures
from dashboard.data import (
    STEP_LINES_MAX,
    LoadedRun,
    StepMarks,
    StepTimes,
    line_ranks,
    load_runs,
    rank_lines,
    step_marks,
    step_spread,
    step_times,
)

STRAGGLER = Path(__file__).parents[1] / "data" / "golden-runs" / "dp-straggler"


def _rank_steps(ranks: int, steps: int, slow_rank: int) -> pd.DataFrame:
    rank, step = np.meshgrid(np.arange(ranks), np.arange(1, steps + 1), indexing="ij")
    wall_s = 0.1 + 0.001 * step + 0.0001 * rank + np.where(rank == slow_rank, 0.05, 0.0)
    return pd.DataFrame({"rank": rank.ravel(), "step": step.ravel(), "wall_s": wall_s.ravel()})


def test_the_spread_is_the_median_min_max_and_slowest_rank_per_step() -> None:
    rank_steps = pd.DataFrame({
        "rank": [0, 1, 2, 0, 1, 2], "step": [2, 2, 2, 1, 1, 1],
        "wall_s": [0.4, 0.9, 0.5, 0.3, 0.3, 0.1],
    })  # fmt: skip
    spread = step_spread(rank_steps)
    assert spread["step"].tolist() == [1, 2]
    assert spread["median_s"].tolist() == pytest.approx([0.3, 0.5])
    assert spread["min_s"].tolist() == pytest.approx([0.1, 0.4])
    assert spread["max_s"].tolist() == pytest.approx([0.3, 0.9])
    assert spread["max_rank"].tolist() == [0, 1]  # a tie: the lowest rank
    assert spread["ranks"].tolist() == [3, 3]
    assert step_spread(rank_steps.iloc[0:0]).empty


def test_a_small_run_draws_every_rank_the_blamed_bold_and_named() -> None:
    rank_steps = _rank_steps(4, 6, slow_rank=1)
    assert line_ranks(rank_steps, [1]) == [0, 1, 2, 3]
    times = StepTimes(
        step_spread(rank_steps), rank_lines(rank_steps, [0, 1, 2, 3]), [1], StepMarks([], [])
    )
    fig = figures.step_time_over_steps(times)
    names = [t.name for t in fig.data]
    assert names == ["median over ranks", "rank 0", "rank 1 !", "rank 2", "rank 3"]  # no band
    straggler = fig.data[2]
    # each rank in its own colour (from its number only), the blamed bold
    assert [t.line.color for t in fig.data[1:]] == [figures.rank_color(r) for r in range(4)]
    assert straggler.line.width == 3 and {t.line.width for t in fig.data[1:]} == {1.5, 3}
    slow_ms = 1e3 * rank_steps.loc[rank_steps["rank"] == 1, "wall_s"]
    assert list(straggler.y) == pytest.approx(slow_ms.tolist())
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.range == (0.5, 6.5)


def test_a_large_run_draws_the_band_the_median_and_only_the_blamed_ranks() -> None:
    rank_steps = _rank_steps(1024, 5, slow_rank=700)
    blamed = [700, *range(20)]  # a straggler, then a host's ranks
    drawn = line_ranks(rank_steps, blamed)
    assert drawn == blamed[:STEP_LINES_MAX]
    lines = rank_lines(rank_steps, drawn)
    times = StepTimes(step_spread(rank_steps), lines, blamed, StepMarks([], []))
    fig = figures.step_time_over_steps(times)
    assert len(fig.data) == 3 + STEP_LINES_MAX  # band (2 traces), median, the blamed lines
    band_max, band_min = fig.data[0], fig.data[1]
    assert band_min.name == "min-max over the 1024 ranks" and band_min.fill == "tonexty"
    assert list(band_max.customdata) == [700] * 5  # the hover names the slowest rank
    assert [t.name for t in fig.data[3:]] == [f"rank {r} !" for r in sorted(drawn)]
    assert [t.line.color for t in fig.data[3:]] == [figures.rank_color(r) for r in sorted(drawn)]
    assert len(fig.to_json()) < 50_000  # lines of the blamed ranks, never of 1,024 ranks


def test_onsets_and_trends_of_the_findings_are_marked() -> None:
    findings = [
        {"rule": "BAL001", "ranks": [1], "evidence": {"busy_s_per_step": {"1": 0.2}}},
        {"rule": "HST001", "ranks": [0, 1], "evidence": {"from_step": 4}},
        {"rule": "HST001", "ranks": [2, 3], "evidence": {"from_step": 99}},  # after the run
        {"rule": "PIT003", "ranks": [0], "evidence": {"first_step": 5, "steps": 2}},
        {"rule": "TRD001", "ranks": [],
         "evidence": {"slope_s_per_step": 0.01, "growth": 0.5, "steps": 6}},
    ]  # fmt: skip
    marks = step_marks(findings, [1, 2, 3, 4, 5, 6])
    assert [(o.rule, o.step, o.label) for o in marks.onsets] == [
        ("HST001", 4, "HST001 from step 4"), ("PIT003", 5, "PIT003 from step 5"),
    ]  # fmt: skip
    assert [(t.rule, t.label) for t in marks.trends] == [
        ("TRD001", "TRD001 trend: +50% over 6 steps")
    ]
    rank_steps = _rank_steps(2, 6, slow_rank=1)
    spread = step_spread(rank_steps)
    fig = figures.step_time_over_steps(
        StepTimes(spread, rank_lines(rank_steps, [0, 1]), [1], marks)
    )
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert [(b.x0, b.x1, b.name) for b in bands] == [
        (3.5, 6.5, "HST001 from step 4"), (4.5, 6.5, "PIT003 from step 5"),
    ]  # fmt: skip
    assert all(b.showlegend for b in bands)
    trend = next(t for t in fig.data if t.name == "TRD001 trend: +50% over 6 steps")
    slowest_ms = 1e3 * spread["max_s"].median()
    assert np.diff(trend.y) == pytest.approx([10.0] * 5)  # 0.01 s a step, in ms
    assert trend.y[2] + 5.0 == pytest.approx(slowest_ms)  # through the medians (3.5, ...)


def test_a_run_is_drawn_with_its_blamed_ranks() -> None:
    loaded: LoadedRun = load_runs([STRAGGLER])[0]
    times = step_times(loaded)
    assert times is not None
    assert times.blamed == loaded.blamed_ranks == [1]
    assert sorted(times.lines["rank"].unique()) == [0, 1]
    assert times.spread["step"].tolist() == sorted(loaded.metrics.rank_steps["step"].unique())
    assert "rank 1 !" in {t.name for t in figures.step_time_over_steps(times).data}
