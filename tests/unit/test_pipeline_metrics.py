"""diag.metrics.pipeline on hand-written tables and runs: stages, bubble, stage imbalance,
report."""

from __future__ import annotations

import pandas as pd
import pytest

from diag.contract import ledger
from diag.contract.schema import Layout, Manifest
from diag.metrics import compute_metrics, pipeline
from diag.outputs.report import build_report, render_text
from diag.read.load import load_run

approx = pytest.approx
NO_SPANS = pd.DataFrame(
    {"rank": pd.Series([], dtype="int64"), "stage": pd.Series([], dtype=object)}
)


def _manifest(world: int, **layout: int) -> Manifest:
    return Manifest(run_id="t", created="", world_size=world, layout=Layout(**layout))


def test_stage_from_the_grid_the_groups_and_the_spans() -> None:
    # grid order dp, pp, ep, tp: pp=2 x dp=2 -> ranks 0,1 are replica 0, stages 0,1
    assert pipeline.rank_stages(NO_SPANS, _manifest(4, dp=2, pp=2)) == {0: 0, 1: 1, 2: 0, 3: 1}
    grouped = _manifest(4, dp=2, pp=2)
    grouped.groups = {"pp": [[0, 2], [1, 3]]}  # a trainer that laid the stages out otherwise
    assert pipeline.rank_stages(NO_SPANS, grouped) == {0: 0, 1: 0, 2: 1, 3: 1}
    spans = pd.DataFrame({"rank": [0, 0, 0, 1, 1], "stage": [3, 3, 1, None, 2]})
    stages = pipeline.rank_stages(spans, _manifest(4, pp=4))
    assert stages == {0: 3, 1: 2, 2: 2, 3: 3}  # spans win; ranks without them keep the grid


def _ranks(rows: list[tuple[int, int, float, float]]) -> pd.DataFrame:
    """rank, steps, busy_s, wall_s (no collectives: the stage's work is its compute)."""
    frame = pd.DataFrame(rows, columns=["rank", "steps", "busy_s", "wall_s"])
    return frame.assign(stage_work_s=frame["busy_s"])


def test_bubble_per_rank_per_stage_and_imbalance() -> None:
    # pp=2 x dp=2, 2 steps of 1 s each: stage 0 computes 0.5 and 0.7 s per step on its two
    # replicas, stage 1 0.8 and 0.8 s.
    ranks = _ranks([(0, 2, 1.0, 2.0), (1, 2, 1.6, 2.0), (2, 2, 1.4, 2.0), (3, 2, 1.6, 2.0)])
    table = pipeline.with_stages(ranks, NO_SPANS, _manifest(4, dp=2, pp=2))
    assert table["stage"].tolist() == [0, 1, 0, 1]
    assert table["bubble_frac"].tolist() == approx([0.5, 0.2, 0.3, 0.2])
    stages = pipeline.stage_table(table)
    assert stages["stage"].tolist() == [0, 1] and stages["ranks"].tolist() == [2, 2]
    assert stages["busy_per_step_s"].tolist() == approx([0.6, 0.8])
    assert stages["bubble_frac"].tolist() == approx([1 - 2.4 / 4, 1 - 3.2 / 4])
    summary = pipeline.pipeline_summary(table)
    assert summary["bubble_fraction"] == approx((0.4 + 0.2) / 2)
    assert summary["stage_imbalance"] == approx(0.8 / 0.7)


def test_no_pipeline_no_stage_columns_values() -> None:
    table = pipeline.with_stages(_ranks([(0, 2, 1.0, 2.0)]), NO_SPANS, _manifest(1, dp=1))
    assert table["stage"].tolist() == [None] and table["bubble_frac"].tolist() == [None]
    assert pipeline.stage_table(table).empty
    assert pipeline.pipeline_summary(table) == {"bubble_fraction": None, "stage_imbalance": None}


def test_a_blocking_receive_is_bubble_not_idle(runs) -> None:
    """pp=2, m=2, 3 steps of 100 ms. Stage 0 computes 60 ms a step; stage 1 first waits 40 ms in
    a blocking recv (exposed comm, so the old mean-of-idle gave 0 for it), then computes 60 ms.
    Bubble: stage 0 40%, stage 1 40%; run 40% (theory 1/3)."""
    records: dict[int, list] = {0: [], 1: []}
    for s in range(3):
        t = 100 * s
        records[0] += [runs.span(s, "fwd", t, t + 20, stage=0), runs.span(s, "bwd", t + 40, t + 80,
                       stage=0), runs.step(s, t, t + 100)]  # fmt: skip
        records[1] += [
            runs.comm(s, t, t + 40, op="recv", group="pp", group_size=2, tag="act"),
            runs.span(s, "fwd", t + 40, t + 60, stage=1),
            runs.span(s, "bwd", t + 60, t + 100, stage=1),
            runs.step(s, t, t + 100, loss=2.0),
        ]
    manifest = runs.manifest(2, layout={"dp": 1, "pp": 2, "microbatches": 2, "schedule": "1f1b"})
    run = load_run(runs.write(records, manifest))
    metrics = compute_metrics(run)
    ranks = metrics.ranks.set_index("rank")
    assert ranks["stage"].tolist() == [0, 1]
    assert ranks["bubble_frac"].tolist() == approx([0.4, 0.4])
    assert ranks.loc[1, "idle_frac"] == approx(0.0)  # the wait is exposed comm, not idle
    summary = metrics.summary
    assert summary["bubble_fraction"] == approx(0.4)
    assert summary["bubble_theory"] == approx(ledger.bubble_fraction(2, 2))
    assert summary["stage_imbalance"] == approx(1.0)

    report = build_report(run, metrics)
    assert report["summary"]["stage_imbalance"] == approx(1.0)
    assert {r["stage"] for r in report["ranks"]} == {0, 1}
    text = render_text(report)
    assert "bubble 40% (theory 33%)" in text and "stage imbalance 1" in text
    assert "pipeline stages" in text


def test_tp_collectives_and_the_dp_wait_are_the_stage_s_work_not_bubble(runs) -> None:
    """pp=2 x tp: each stage computes 40 ms, then a blocking TP all-reduce of 20 ms; stage 1
    first waits 20 ms in a pp recv; both end with a 20 ms comm_wait for the DP all-reduce.
    Bubble: stage 0 20% (idle from 80 to 100 ms), stage 1 20% (the recv); the TP all-reduce
    and the DP wait are the stages' own time, as in the schedule's theory."""
    records: dict[int, list] = {0: [], 1: []}
    for s in range(3):
        t = 100 * s
        records[0] += [
            runs.span(s, "fwd", t, t + 40, stage=0),
            runs.comm(s, t + 40, t + 60, op="all_reduce", group="tp", group_size=2),
            runs.span(s, "comm_wait", t + 60, t + 80, mb=None),
            runs.step(s, t, t + 100),
        ]
        records[1] += [
            runs.comm(s, t, t + 20, op="recv", group="pp", group_size=2),
            runs.span(s, "fwd", t + 20, t + 60, stage=1),
            runs.comm(s, t + 60, t + 80, op="all_reduce", group="tp", group_size=2),
            runs.span(s, "comm_wait", t + 80, t + 100, mb=None),
            runs.step(s, t, t + 100),
        ]
    manifest = runs.manifest(2, layout={"dp": 1, "pp": 2, "microbatches": 1})
    metrics = compute_metrics(load_run(runs.write(records, manifest)))
    ranks = metrics.ranks.set_index("rank")
    assert ranks["bubble_frac"].tolist() == approx([0.2, 0.2])
    assert ranks["busy_frac"].tolist() == approx([0.4, 0.4])
    assert metrics.summary["bubble_fraction"] == approx(0.2)


def test_dp_report_has_no_pipeline_section(golden_dp2) -> None:
    run = load_run(golden_dp2)
    report = build_report(run, compute_metrics(run))
    assert "stage_imbalance" not in report["summary"]
    assert all(r["stage"] is None and r["bubble_frac"] is None for r in report["ranks"])
    assert "pipeline stages" not in render_text(report)
