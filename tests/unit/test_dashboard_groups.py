"""The dashboard at scale: ranks grouped by host, stage, DP replica or block, group x step
heatmaps, per-group medians and slowest ranks, and the drill-down to one group's ranks, on a
synthetic 1,024-rank run (DP, hosts of 8 ranks, rank 1 a straggler) and on small tables."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from dash import html

from benchmarks.synthetic_run import write_synthetic_run
from dashboard import figures
from dashboard.components import clicked_group, clicked_step
from dashboard.data import (
    PER_RANK_MAX,
    LoadedRun,
    dp_replicas,
    group_members,
    group_stats,
    groupings,
    load_runs,
    memory_totals,
    pick_group,
    pick_grouping,
    rank_groups,
    rank_step_values,
    step_grid,
)
from dashboard.pages import memory, ranks, timeline
from diag.contract.schema import Layout, Manifest

GOLDEN = Path(__file__).parents[1] / "data" / "dp2-golden"
HOSTILE = '<img src=x onerror="alert(1)">'


def _graphs(component: Any) -> dict[str, go.Figure]:
    """Every dcc.Graph in a component tree, by id."""
    found = {component.id: component.figure} if type(component).__name__ == "Graph" else {}
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str):
            found |= _graphs(child)
    return found


def _table_ranks(component: Any) -> list[int]:
    """The rank column of the ranks table in a component tree."""
    if getattr(component, "id", None) == "ranks-table":
        body = component.children[1]
        return [int(row.children[0].children) for row in body.children]
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str):
            found = _table_ranks(child)
            if found:
                return found
    return []


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> LoadedRun:
    """1,024 ranks on 128 hosts x 4 steps (3 analysed), rank 1 a straggler."""
    out = tmp_path_factory.mktemp("large") / "dp1024"
    write_synthetic_run(out, ranks=1024, steps=4, microbatches=1)
    return load_runs([out])[0]


@pytest.fixture(scope="module")
def golden() -> LoadedRun:
    return load_runs([GOLDEN])[0]


def _with_manifest(loaded: LoadedRun, **changes: Any) -> LoadedRun:
    manifest = dataclasses.replace(loaded.run.manifest, **changes)
    return dataclasses.replace(loaded, run=dataclasses.replace(loaded.run, manifest=manifest))


# --- Grouping -----------------------------------------------------------------------------------


def _manifest(world: int, layout: Layout, groups: dict[str, list[list[int]]]) -> Manifest:
    return Manifest(run_id="r", created="", world_size=world, layout=layout, groups=groups)


def test_dp_replicas_from_the_dp_groups() -> None:
    # tp = 2 inside dp = 2 (the reference grid): DP groups pair rank i with i + 2
    manifest = _manifest(4, Layout(dp=2, tp=2), {"dp": [[0, 2], [1, 3]], "tp": [[0, 1], [2, 3]]})
    assert dp_replicas(manifest, range(4)).tolist() == [0, 0, 1, 1]
    # a Megatron-style order (dp inner): every DP group holds one rank of each replica
    manifest = _manifest(8, Layout(dp=2, tp=4), {"dp": [[4, 0], [1, 5], [2, 6], [3, 7]]})
    assert dp_replicas(manifest, range(8)).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # pure DP: every rank holds its own copy
    manifest = _manifest(4, Layout(dp=4), {"dp": [[0, 1, 2, 3]]})
    assert dp_replicas(manifest, range(4)).tolist() == [0, 1, 2, 3]


def test_dp_replicas_without_dp_groups_follow_the_layout() -> None:
    assert dp_replicas(_manifest(8, Layout(dp=2, pp=4), {}), range(8)).tolist() == [0] * 4 + [1] * 4
    assert dp_replicas(_manifest(4, Layout(dp=1, tp=4), {}), range(4)).tolist() == [0] * 4
    # a rank in no DP group (a group list that misses it) is replica 0, not an error
    manifest = _manifest(3, Layout(dp=2), {"dp": [[1, 2]]})
    assert dp_replicas(manifest, range(3)).tolist() == [0, 0, 1]


def test_small_runs_show_every_rank(golden: LoadedRun) -> None:
    assert groupings(golden) == ["none"]
    assert pick_grouping(golden, "host") == "none"  # one host: no grouping by it
    groups = rank_groups(golden, "none")
    assert groups["group"].tolist() == ["rank 0", "rank 1"]


def test_large_runs_group_by_host_by_default(large: LoadedRun) -> None:
    # pure DP: a replica is one rank (no grouping), no pipeline: no stages; blocks as a fallback
    assert groupings(large) == ["host", "block"]
    assert pick_grouping(large, None) == pick_grouping(large, "../../etc") == "host"
    assert pick_grouping(large, "block") == "block"
    assert pick_grouping(large, "none") == "host"  # per rank is for small runs only
    hosts = rank_groups(large, "host")
    assert len(hosts) == 1024 and hosts["group"].nunique() == 128
    assert hosts.groupby("group")["rank"].size().eq(8).all()
    assert hosts.drop_duplicates("order")["group"].tolist()[:3] == ["node0", "node1", "node2"]
    assert hosts.loc[hosts["group"] == "node5", "rank"].tolist() == list(range(40, 48))
    blocks = rank_groups(large, "block")
    assert blocks["group"].nunique() == 32 and blocks["group"].iloc[-1] == "ranks 992-1023"


def test_replica_and_stage_groupings(large: LoadedRun) -> None:
    # the same ranks as 4 replicas of 256 ranks (tp x pp = 256, no DP groups in the manifest)
    replicas = _with_manifest(large, layout=Layout(dp=4, tp=8, pp=32), groups={})
    groups = rank_groups(replicas, "replica")
    assert groups.groupby("group")["rank"].agg(["min", "max"]).values.tolist() == [
        [0, 255], [256, 511], [512, 767], [768, 1023]
    ]  # fmt: skip
    assert "replica" in groupings(replicas)
    # stages come from the metrics (diag.metrics.pipeline): rank r holds stage r % 2 here
    staged = dataclasses.replace(
        replicas,
        metrics=dataclasses.replace(
            replicas.metrics, ranks=replicas.metrics.ranks.assign(stage=lambda t: t["rank"] % 2)
        ),
    )
    stages = rank_groups(staged, "stage")
    assert stages.groupby("group")["rank"].size().to_dict() == {"stage 0": 512, "stage 1": 512}
    assert "stage" in groupings(staged)


def test_pick_group_and_members(large: LoadedRun) -> None:
    groups = rank_groups(large, "host")
    assert pick_group(groups, None, [1]) == "node0"  # the group of the first blamed rank
    assert pick_group(groups, "node7", [1]) == "node7"
    assert pick_group(groups, HOSTILE, [42, 1]) == "node5"
    assert pick_group(groups, 3, []) == "node0"  # not a group name: the first group
    assert group_members(groups, "node5") == (list(range(40, 48)), 8)
    # a group larger than the limit: its blamed ranks, then the lowest
    blocks = rank_groups(large, "block")
    members, size = group_members(blocks, "ranks 0-31", blamed=[30], limit=4)
    assert (members, size) == ([0, 1, 2, 30], 32)


# --- Statistics ---------------------------------------------------------------------------------


def _two_groups() -> pd.DataFrame:
    return pd.DataFrame(
        {"rank": [0, 1, 2, 3], "group": ["a", "a", "b", "b"], "order": [0, 0, 1, 1]}
    )


def test_step_grid_keeps_the_slowest_rank() -> None:
    values = pd.DataFrame({
        "rank": [0, 1, 2, 3, 0, 1, 2, 3], "step": [5, 5, 5, 5, 6, 6, 6, 6],
        "value": [1.0, 9.0, 2.0, 2.0, 1.0, 1.0, 3.0, np.nan],
    })  # fmt: skip
    grid = step_grid(values, _two_groups())
    assert grid.rows == ["a", "b"] and grid.steps == [5, 6]
    np.testing.assert_allclose(grid.maximum, [[9.0, 1.0], [2.0, 3.0]])
    np.testing.assert_allclose(grid.median, [[5.0, 1.0], [2.0, 3.0]])
    assert grid.top_rank.tolist() == [[1, 0], [2, 2]]  # ties: the lowest rank


def test_group_stats_median_maximum_and_blame() -> None:
    values = pd.DataFrame({"rank": [0, 1, 2, 3], "value": [1.0, 7.0, 4.0, 2.0]})
    stats = group_stats(values, _two_groups(), blamed=[1])
    assert stats["group"].tolist() == ["a", "b"]
    assert stats["median"].tolist() == [4.0, 3.0]
    assert stats["maximum"].tolist() == [7.0, 4.0]
    assert stats["max_rank"].tolist() == [1, 2]
    assert stats["blamed"].tolist() == [True, False]
    assert stats["ranks"].tolist() == [2, 2]


def test_large_run_statistics_find_the_straggler(large: LoadedRun) -> None:
    hosts = rank_groups(large, "host")
    grid = step_grid(rank_step_values(large.metrics.rank_steps, "busy"), hosts)
    assert grid.maximum.shape == (128, 3)
    assert (grid.top_rank[0] == 1).all()  # rank 1 is the slowest of node0 at every step
    assert (grid.maximum[0] > 1.3 * grid.median[0]).all()  # and not averaged away
    per_rank = step_grid(rank_step_values(large.metrics.rank_steps, "busy"),
                         rank_groups(large, "none"))  # fmt: skip
    assert per_rank.maximum.shape == (1024, 3)
    np.testing.assert_array_equal(per_rank.top_rank[:, 0], np.arange(1024))


def test_memory_totals_carry_unsampled_categories() -> None:
    steps = pd.DataFrame({
        "rank": [0, 0, 0], "step": [0, 1, 1], "params": [10.0, 10.0, 10.0],
        "grads": [1.0, 2.0, 3.0], "optimizer": [None, None, None],
        "activations": [5.0, None, None], "comm_buffers": [None] * 3, "fragmentation": [None] * 3,
    })  # fmt: skip
    totals = memory_totals(steps)
    assert totals["value"].tolist() == [16.0, 18.0]  # step 1: its last grads, step 0's activations


# --- Figures and pages at 1,024 ranks -----------------------------------------------------------


def test_ranks_page_aggregates_and_drills_into_the_blamed_host(large: LoadedRun) -> None:
    started = time.perf_counter()
    page = ranks.layout(large, [large])
    shown = _graphs(page)
    assert set(shown) == {
        "ranks-heatmap", "ranks-groups", "ranks-breakdown", "ranks-busy"
    }  # fmt: skip
    (heatmap,) = shown["ranks-heatmap"].data
    assert isinstance(heatmap, go.Heatmap) and np.shape(heatmap.z) == (128, 3)
    assert heatmap.y[0] == "node0 !" and heatmap.y[1] == "node1"
    bars = shown["ranks-groups"]
    assert len(bars.data[0].x) == 128 and bars.data[1].customdata[0] == 1  # node0's max: rank 1
    assert bars.data[1].text[0] == "rank 1" and bars.data[1].text[1] == ""
    # the drill-down: node0's ranks one by one, and no one else
    assert list(shown["ranks-breakdown"].data[0].x) == ["rank 0", "rank 1 !"] + [
        f"rank {r}" for r in range(2, 8)
    ]
    assert sorted(_table_ranks(page)) == list(range(8))
    # another group, as a click or the selector picks it
    other = html.Div(ranks.detail(large, "host", "node5"))
    assert sorted(_table_ranks(other)) == list(range(40, 48))
    assert _graphs(other)["ranks-breakdown"].data[0].x[0] == "rank 40"
    # every metric has its heatmap, blocks too
    for metric in ("busy", "exposed", "idle", "wall"):
        hm, _ = ranks.group_figures(large, "block", metric)
        assert np.shape(hm.data[0].z) == (32, 3)
    # the replay's split of the waiting: per communication group (DP only here), not per step
    offered = _radio_values(page)
    assert offered == ["busy", "exposed", "idle", "wall", "skew", "transfer"]
    for metric in ("skew", "transfer"):
        hm, group_chart = ranks.group_figures(large, "block", metric)
        assert np.shape(hm.data[0].z) == (32, 1) and list(hm.data[0].x) == ["dp"]
        assert len(group_chart.data[0].x) == 32
    hm, group_chart = ranks.group_figures(large, "host", "skew")
    assert hm.data[0].y[0] == "node0 !"
    assert group_chart.data[1].customdata[0] != 1  # the straggler arrives last: it never waits
    assert time.perf_counter() - started < 10  # vectorised: well under a second on a laptop


def _radio_values(component: Any) -> list[Any]:
    """The values of the `ranks-metric` selector in a component tree."""
    if getattr(component, "id", None) == "ranks-metric":
        return [option["value"] for option in component.options]
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str):
            found = _radio_values(child)
            if found:
                return found
    return []


def test_ranks_named_by_a_low_finding_are_blamed(large: LoadedRun) -> None:
    # communication dominates this run's step, so the straggler's BAL001 costs little and is
    # low; rank 1 is still the rank the diagnosis names, and the pages mark it
    straggler = next(f for f in large.report["findings"] if f["rule"] == "BAL001")
    assert straggler["severity"] == "low" and straggler["ranks"] == [1]
    assert large.blamed_ranks == [1]
    # the order is the findings': the ranks of the first finding first
    findings = [{"severity": "low", "ranks": [7, 3]}, {"severity": "high", "ranks": [3, 5]}]
    assert dataclasses.replace(large, report={"findings": findings}).blamed_ranks == [7, 3, 5]


def test_timeline_draws_one_group_at_a_time(large: LoadedRun) -> None:
    page = timeline.layout(large, [large])
    shown = _graphs(page)
    assert isinstance(shown["timeline-groups"].data[0], go.Heatmap)
    assert np.shape(shown["timeline-groups"].data[0].z) == (128, 3)
    rows = list(shown["timeline-graph"].layout.yaxis.categoryarray)
    assert sorted(rows) == sorted(["rank 0", "rank 1 !", *(f"rank {r}" for r in range(2, 8))])
    fig, note = timeline.figure(large, 2, 2, "host", "node5")
    assert {int(r) for trace in fig.data for r in pd.Series(trace.y).str.split().str[1]} == set(
        range(40, 48)
    )
    assert set(fig.layout.yaxis.categoryarray) == {f"rank {r}" for r in range(40, 48)}
    assert "node5" in note and "8 ranks" in note
    # groups larger than PER_RANK_MAX are cut, the blamed rank kept
    fig, note = timeline.figure(
        _with_manifest(large, layout=Layout(dp=2, tp=512), groups={}), 2, 1, "replica", None
    )
    assert len(fig.layout.yaxis.categoryarray) == PER_RANK_MAX
    assert "rank 1 !" in fig.layout.yaxis.categoryarray and "of the 512 ranks" in note


def test_memory_page_aggregates_per_group(large: LoadedRun) -> None:
    shown = _graphs(memory.layout(large, [large]))
    assert set(shown) == {"memory-heatmap", "memory-groups", "memory-ranks", "memory-steps"}
    assert np.shape(shown["memory-heatmap"].data[0].z) == (128, 4)  # every step has memory
    assert len(shown["memory-groups"].data[0].x) == 128
    assert len(shown["memory-ranks"].data[0].x) == 8  # one group's ranks


def test_group_figures_keep_names_as_text() -> None:
    stats = pd.DataFrame({
        "group": [HOSTILE, "b"], "ranks": [2, 2], "median": [1.0, 2.0], "maximum": [3.0, 4.0],
        "max_rank": [1, 3], "blamed": [True, False],
    })  # fmt: skip
    bars = figures.group_bars(stats, HOSTILE)
    assert bars.data[0].x[0] == figures.plain(HOSTILE) + " !"
    assert bars.layout.title.text == figures.plain(HOSTILE)
    groups = pd.DataFrame({"rank": [0, 1], "group": [HOSTILE, "b"], "order": [0, 1]})
    grid = step_grid(pd.DataFrame({"rank": [0, 1], "step": [0, 0], "value": [1.0, 2.0]}), groups)
    heatmap = figures.step_heatmap(grid, "t", blamed_rows=[HOSTILE])
    assert list(heatmap.data[0].y) == [figures.plain(HOSTILE) + " !", "b"]
    # a click hands the label back: it maps to the group, whatever the browser sends otherwise
    click = {"points": [{"x": 0, "y": figures.plain(HOSTILE) + " !"}]}
    assert clicked_group(click, groups) == HOSTILE
    assert clicked_group({"points": [{"y": HOSTILE}]}, groups) is None
    assert clicked_group({"points": []}, groups) is None and clicked_group(None, groups) is None
    assert clicked_step(click) == 0 and clicked_step({"points": [{"x": "2"}]}) is None


def _texts(component: Any) -> list[str]:
    """Every string in a component tree."""
    if isinstance(component, str):
        return [component]
    children = getattr(component, "children", None)
    if isinstance(children, str):
        return [children]
    items = children if isinstance(children, list | tuple) else [children]
    return [t for child in items if child is not None for t in _texts(child)]


def test_timeline_of_a_large_run_offers_only_the_steps_whose_spans_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diag.read import load, record_window

    run_dir = write_synthetic_run(tmp_path / "run", ranks=16, steps=12)
    monkeypatch.setattr(load, "REDUCE_SPANS_FROM_BYTES", 0)
    monkeypatch.setattr(record_window, "SPAN_WINDOW_STEPS", 4)
    (loaded,) = load_runs([run_dir])
    assert loaded.run.span_steps == 4
    assert timeline.timeline_steps(loaded) == [1, 2, 3]  # step 0 is warm-up
    page = timeline.layout(loaded, [loaded])
    assert any("spans are kept for steps below 4" in text for text in _texts(page))
    fig, _ = timeline.figure(loaded, 9, 1)  # a step without spans: the first step is drawn
    assert sum(len(trace.x) for trace in fig.data if trace.x is not None) > 0
