"""The dashboard without a browser: figure builders, page layouts on a real run directory, the
run selector's input handling and what the server answers to paths it must not serve."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboard import figures
from dashboard.app import PAGES, create_app
from dashboard.data import (
    comm_share_by_step,
    expert_steps,
    load_runs,
    memory_at_peak,
    memory_of_rank,
    peak_rank,
    pick,
    timeline_window,
)
from diag import attribution_words
from diag.errors import InputError
from tests.conftest import copy_with_names

GOLDEN = Path(__file__).parents[1] / "data" / "dp2-golden"
STRAGGLER = Path(__file__).parents[1] / "data" / "golden-runs" / "dp-straggler"
HOSTILE = '<img src=x onerror="alert(1)">'


def _texts(component: Any) -> list[str]:
    """Every string child in a Dash component tree."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, list | tuple):
        return [t for child in component for t in _texts(child)]
    children = getattr(component, "children", None)
    return _texts(children) if children is not None else []


def _graphs(component: Any) -> list[Any]:
    found = [component] if type(component).__name__ == "Graph" else []
    children = getattr(component, "children", None)
    if isinstance(children, list | tuple):
        return found + [g for child in children for g in _graphs(child)]
    return found + (_graphs(children) if children is not None else [])


@pytest.fixture(scope="module")
def golden() -> Any:
    return load_runs([GOLDEN])[0]


def test_every_page_renders_the_golden_run(golden: Any) -> None:
    layouts = {page.PATH: page.layout(golden, [golden]) for page in PAGES}
    assert set(layouts) == {"/", "/timeline", "/ranks", "/communication", "/memory", "/experts",
                            "/compare"}  # fmt: skip
    for path in ("/timeline", "/ranks", "/communication", "/memory"):
        graphs = _graphs(layouts[path])
        assert graphs and all(isinstance(g.figure, go.Figure) for g in graphs), path
        assert all(len(g.figure.data) > 0 for g in graphs), path
    # a DP run has no experts, and one run has nothing to compare: said, not empty axes
    assert any("not an expert-parallel run" in t for t in _texts(layouts["/experts"]))
    assert any("two or more runs" in t for t in _texts(layouts["/compare"]))
    overview = " ".join(_texts(layouts["/"]))
    assert "step time" in overview and "tokens/s" in overview


def test_overview_lists_findings_first_one_first(golden: Any) -> None:
    texts = _texts(PAGES[0].layout(golden, [golden]))
    rules = [f["rule"] for f in golden.report["findings"]]
    shown = [t.strip() for t in texts if t.strip() in rules]
    assert shown == rules


@pytest.fixture(scope="module")
def straggler(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The stored DP run with rank 1 a straggler (150 ms injected), loaded from a copy."""
    run = tmp_path_factory.mktemp("straggler") / "dp-straggler"
    shutil.copytree(STRAGGLER, run)
    return load_runs([run])[0]


def test_waterfall_measures_each_cause_alone_against_the_ideal_step(straggler: Any) -> None:
    attribution = straggler.report["attribution"]
    fig = figures.step_waterfall(attribution)
    measured, ideal, costs = fig.data
    assert all(isinstance(t, go.Bar) and t.orientation == "h" for t in fig.data)
    assert fig.layout.barmode == "stack"
    # rows top to bottom: the measured step, the ideal step, each cause on the ideal step
    causes = [c for c in attribution["causes"] if c["cost_share"] >= 0.005]
    rows = list(fig.layout.yaxis.categoryarray)[::-1]
    assert rows[:2] == ["measured step (replayed)", "ideal step"] and len(rows) == 2 + len(causes)
    assert list(measured.x) == pytest.approx([1e3 * attribution["replayed_step_s"]])
    assert list(ideal.x) == pytest.approx([1e3 * attribution["ideal_step_s"]] * (len(rows) - 1))
    assert list(costs.x) == pytest.approx([1e3 * c["cost_s"] for c in causes])
    assert "rank 1" in costs.y[0] and "(23%)" in costs.text[0]
    assert fig.layout.xaxis.range[0] == 0  # a quantity: from zero
    # no bar for the overlap: the words say it
    assert not any("overlap" in str(y) for t in fig.data for y in t.y)


def test_the_overlap_of_the_causes_is_said_in_words_not_drawn() -> None:
    attribution = {
        "replayed_step_s": 0.1, "ideal_step_s": 0.05, "steps_replayed": 3, "replay_error": 0.01,
        "causes": [
            {"label": "a", "cost_s": 0.04, "cost_share": 0.4},
            {"label": "b <b>", "cost_s": 0.03, "cost_share": 0.3},
            {"label": "c", "cost_s": 0.0002, "cost_share": 0.002},  # too small to draw
            {"label": "d", "cost_s": 0.0, "cost_share": 0.0},  # no cost: no bar
        ],
    }  # fmt: skip
    fig = figures.step_waterfall(attribution)
    assert list(fig.data[2].y) == ["a", "b &lt;b&gt;"]
    words = attribution_words(attribution)
    assert "Together the causes add to 70.2 ms, 20.2 ms more than the gap: they overlap" in words
    assert "1 cause costing under 0.5% of the step is not drawn" in words


def test_overview_shows_the_waterfall_and_what_findings_cost(straggler: Any) -> None:
    page = PAGES[0].layout(straggler, [straggler])
    waterfall, step_time = _graphs(page)
    assert waterfall.id == "overview-waterfall" and step_time.id == "overview-step-time"
    assert isinstance(waterfall.figure.data[0], go.Bar)
    assert "rank 1 !" in {t.name for t in step_time.figure.data}  # the straggler's own line
    assert any(t.startswith("The ideal step") for t in _texts(page))  # the overlap in words
    texts = " ".join(_texts(page))
    cost = straggler.report["findings"][0]
    assert cost["rule"] == "BAL001" and cost["cost_s"] is not None
    share = f"{100 * cost['cost_share']:.0f}%"
    assert f"costs {share} of the step ({1e3 * cost['cost_s']:.1f} ms)" in texts
    # a run without an attribution (one rank): a note, not empty axes
    report = {k: v for k, v in straggler.report.items() if k != "attribution"}
    alone = dataclasses.replace(straggler, report=report)
    page = PAGES[0].layout(alone, [alone])
    assert [g.id for g in _graphs(page)] == ["overview-step-time"]
    assert any("no attribution" in t for t in _texts(page))


def test_ranks_page_splits_the_waiting_into_skew_and_transfer(straggler: Any) -> None:
    page = next(p for p in PAGES if p.PATH == "/ranks").layout(straggler, [straggler])
    (breakdown,) = [g.figure for g in _graphs(page) if g.id == "ranks-breakdown"]
    names = [t.name for t in breakdown.data]
    assert names[:3] == ["busy", "exposed: arrival skew", "exposed: transfer"]
    ranks = straggler.metrics.ranks
    skew = list(breakdown.data[1].y)
    assert skew == pytest.approx((ranks["skew_s"] / ranks["step_time_s"]).tolist(), rel=1e-3)
    assert skew[0] > skew[1]  # rank 0 waits for the straggler, rank 1 hardly waits
    stacked = np.sum([list(t.y) for t in breakdown.data], axis=0)
    assert stacked == pytest.approx(np.ones(2), abs=0.01)
    texts = _texts(page)
    assert "skew" in texts and "transfer" in texts  # the table's columns
    assert f"{100 * skew[0]:.0f}%" in texts


def test_timeline_window_aligns_to_the_first_span(golden: Any) -> None:
    window = timeline_window(golden.run, [1])
    assert window.spans["start_ms"].min() == 0
    assert (window.spans["duration_ms"] > 0).all()
    assert set(window.spans["step"]) == {1} and set(window.comms["step"]) == {1}
    fig = figures.timeline(window.spans, window.comms, blamed=[1])
    names = {trace.name for trace in fig.data}
    assert {"fwd", "bwd", "collective"} <= names
    assert "rank 1 !" in fig.layout.yaxis.categoryarray


def test_pick_only_accepts_an_index_in_range(golden: Any) -> None:
    other = load_runs([GOLDEN])[0]
    runs = [golden, other]
    assert pick(runs, 1) is other
    for bad in (-1, 2, "1", "../../etc/passwd", None, True, 1.0):
        assert pick(runs, bad) is golden


def test_run_names_are_unique(tmp_path: Path) -> None:
    runs = load_runs([GOLDEN, GOLDEN])
    assert [r.name for r in runs] == ["dp2-golden", "dp2-golden (2)"]


def test_unusable_run_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="manifest"):
        create_app([tmp_path])


def test_names_from_manifests_stay_text(tmp_path: Path) -> None:
    loaded = load_runs([copy_with_names(GOLDEN, tmp_path / "hostile", HOSTILE)])[0]
    assert loaded.name == HOSTILE
    ranks_page = next(p for p in PAGES if p.PATH == "/ranks").layout(loaded, [loaded])
    assert _texts(ranks_page).count(HOSTILE) == 2  # one cell a rank, as text: React escapes it
    assert figures.plain(HOSTILE) == '&lt;img src=x onerror="alert(1)"&gt;'


def test_server_answers_no_file_outside_its_assets() -> None:
    client = create_app([GOLDEN]).server.test_client()
    index = client.get("/")
    assert index.status_code == 200 and b"diag dashboard" in index.data
    assert client.get("/assets/style.css").status_code == 200
    secret = (Path(__file__).parents[2] / "pyproject.toml").read_bytes()[:60]
    for path in (
        "/assets/../../pyproject.toml",
        "/assets/..%2f..%2fpyproject.toml",
        "/_dash-component-suites/../../pyproject.toml",
        "/pyproject.toml",
        "/..%2f..%2fpyproject.toml",
    ):
        answer = client.get(path)
        assert secret not in answer.data, path


# --- Figure builders on small tables --------------------------------------------------------------


def test_rank_breakdown_stacks_to_one_and_marks_the_blamed() -> None:
    ranks = pd.DataFrame({
        "rank": [0, 1], "busy_frac": [0.9, 0.5], "exposed_comm_share": [0.05, 0.45],
        "idle_frac": [0.05, 0.05], "busy_s": [0.9, 0.5], "steps": [1, 1],
    })  # fmt: skip
    fig = figures.rank_breakdown(ranks, blamed=[0])
    assert [t.name for t in fig.data] == ["busy", "exposed comm", "idle"]
    assert list(fig.data[0].x) == ["rank 0 !", "rank 1"]
    assert list(fig.data[0].marker.line.width) == [3, 0]
    hist = figures.busy_histogram(ranks, blamed=[0])
    assert any("rank 0" in (a.text or "") for a in hist.layout.annotations)


def test_busy_time_is_a_bar_per_rank_up_to_a_few_dozen_ranks_then_a_distribution() -> None:
    def ranks(count: int) -> pd.DataFrame:
        return pd.DataFrame({"rank": range(count), "busy_s": [0.5] * count, "steps": [5] * count})

    bars = figures.busy_per_rank(ranks(4), blamed=[2])
    (trace,) = bars.data
    assert isinstance(trace, go.Bar)
    assert list(trace.x) == ["rank 0", "rank 1", "rank 2 !", "rank 3"]
    assert list(trace.y) == pytest.approx([100.0] * 4)
    assert list(trace.marker.line.width) == [0, 0, 3, 0]  # the blamed rank outlined
    assert list(trace.marker.color) == [figures.rank_color(r) for r in range(4)]
    assert bars.layout.yaxis.rangemode == "tozero"
    many = figures.busy_per_rank(ranks(figures.RANK_BARS_MAX + 1), blamed=[1, 2, 3])
    assert isinstance(many.data[0], go.Histogram)
    assert many.layout.xaxis.rangemode == "tozero"
    # near blamed lines: their labels at different heights
    assert len({a.yshift for a in many.layout.annotations}) == 1  # one value, one line here


def test_a_rank_has_its_colour_whatever_else_is_drawn() -> None:
    assert figures.rank_color(3) == figures.rank_color(3)
    assert len({figures.rank_color(r) for r in range(10)}) == 10  # neighbours differ
    assert figures.rank_color(13) == figures.rank_color(3)


def test_bytes_vs_expected_derives_expected_per_step_from_the_ratio() -> None:
    collectives = pd.DataFrame({
        "op": ["all_to_all"], "group": ["ep"], "tag": [None], "bytes": [400.0 * 2**20],
        "bytes_per_step": [100.0 * 2**20], "ratio": [2.0], "busbw_GBps": [1.0],
    })  # fmt: skip
    fig = figures.bytes_vs_expected(collectives)
    assert list(fig.data[0].y) == [100.0] and list(fig.data[1].y) == [50.0]
    assert list(fig.data[0].x) == ["all_to_all ep"]


def test_comm_share_by_step() -> None:
    rank_steps = pd.DataFrame({
        "rank": [0, 1, 0, 1], "step": [1, 1, 2, 2], "wall_s": [1.0, 1.0, 2.0, 2.0],
        "comm_s": [0.2, 0.4, 1.0, 1.0], "exposed_comm_s": [0.1, 0.1, 0.5, 0.5],
    })  # fmt: skip
    shares = comm_share_by_step(rank_steps)
    assert shares["comm_median"].tolist() == pytest.approx([0.3, 0.5])
    assert shares["comm_max"].tolist() == pytest.approx([0.4, 0.5])
    assert figures.comm_share_over_steps(shares).data[0].name == "comm share (median rank)"


def test_memory_pages_pick_the_peak_rank_and_draw_the_budget() -> None:
    steps = pd.DataFrame({
        "rank": [0, 0, 1, 1], "step": [1, 2, 1, 2], "params": [10.0] * 4, "grads": [10.0] * 4,
        "optimizer": [20.0] * 4, "activations": [5.0, 60.0, 50.0, 1.0],
        "comm_buffers": [1.0, 1.0, 1.0, 40.0], "fragmentation": [None] * 4,
    })  # fmt: skip
    peaks = pd.DataFrame({"rank": [0, 1], "step": [2, 1], "peak_bytes": [101.0, 91.0]})
    assert peak_rank(peaks) == 0
    assert peak_rank(peaks.assign(peak_bytes=[91.0, 91.0])) == 0  # a tie: the lowest rank
    at_peak = memory_at_peak(peaks, steps)
    assert at_peak["step"].tolist() == [2, 1]
    categories = at_peak[["params", "grads", "optimizer", "activations", "comm_buffers"]]
    assert categories.sum(axis=1).tolist() == at_peak["peak_bytes"].tolist()  # bars stack to it
    fig = figures.memory_by_rank(at_peak, budget_bytes=2**20)
    assert "fragmentation" not in {t.name for t in fig.data}  # null on CPU: not drawn as zero
    assert fig.layout.shapes[0].y0 == 1.0  # budget line at 1 MiB
    assert memory_of_rank(steps, 1)["activations"].tolist() == [50.0, 1.0]


def test_sampled_memory_is_drawn_as_samples_never_as_zeros() -> None:
    per_step = pd.DataFrame({
        "step": [0, 1, 2, 3, 4, 5], "params": [10.0 * 2**20] * 6, "grads": [10.0 * 2**20] * 6,
        "optimizer": [None] * 6, "activations": [50.0 * 2**20, None, None, 60.0 * 2**20, None,
                                                 None],
        "comm_buffers": [None] * 6, "fragmentation": [None] * 6,
    }, dtype="float64")  # fmt: skip
    fig = figures.memory_over_steps(per_step, rank=0)
    traces = {t.name: t for t in fig.data}
    assert set(traces) == {"params", "grads", "activations (sampled at 2 of 6 steps)"}
    sampled = traces["activations (sampled at 2 of 6 steps)"]
    assert sampled.mode == "markers" and sampled.fill == "none"  # no area between samples
    assert list(sampled.x) == [0, 3] and list(sampled.y) == [50.0, 60.0]  # only what was measured
    assert all(t.stackgaps == "interpolate" for t in fig.data)  # a gap is never a zero
    assert traces["params"].mode == "lines" and list(traces["params"].x) == list(range(6))
    assert fig.layout.xaxis.range == (-0.5, 5.5)  # step 0's tick label clear of the y axis's


def test_legends_sit_under_the_axis_title_in_the_figure_margin() -> None:
    window = timeline_window(load_runs([GOLDEN])[0].run, [1])
    fig = figures.timeline(window.spans, window.comms)
    # in the container, plotly grows the bottom margin to hold the legend under the x title
    assert fig.layout.legend.yref == "container" and fig.layout.legend.yanchor == "bottom"
    assert fig.layout.legend.y == 0 and fig.layout.xaxis.title.text


def test_expert_steps_sum_over_ranks_and_rate_drops() -> None:
    experts = pd.DataFrame({
        "rank": [0, 1, 0, 1], "step": [0, 0, 1, 1], "layer": [0, 0, 0, 0],
        "tokens": [[3, 1], [3, 1], [4, 0], [4, 0]], "dropped": [0, 0, 2, 2],
    })  # fmt: skip
    (layer,) = expert_steps(experts)
    assert layer.steps == [0, 1]
    np.testing.assert_array_equal(layer.tokens, [[6, 2], [8, 0]])
    assert layer.drop_rate == [0.0, 0.5]
    fig = figures.expert_heatmap(layer.layer, layer.steps, layer.tokens)
    assert list(fig.data[0].x) == ["e0", "e1"]


def _listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_cli_serves_on_loopback_only_by_default() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "diag", "dashboard", str(GOLDEN), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
                    assert answer.status == 200
                    break
            except OSError:
                assert server.poll() is None, "the dashboard exited"
                assert time.monotonic() < deadline, "the dashboard did not come up"
                time.sleep(0.2)
        if Path("/proc/net/tcp").exists():
            assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_cli_unusable_run_is_one_line_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "diag", "dashboard", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("diag: error: ") and result.stderr.count("\n") == 1
    assert str(tmp_path / "missing") in result.stderr
