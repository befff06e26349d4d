"""Gaps whose reading the evidence does not decide (issue 41): a group's ranks that resume closer
together than they arrived, but not together, may have waited for the last of them or done work
of their own. The attribution replays both readings and gives each cost as a range; where the
ranks resume together (or as far apart as they arrived) the cost is one figure.

The truth is the same job simulated without its straggler, both rewritten alike
(simulator.reshape.hide_waits, the ranks resuming up to `SPREAD_MS` apart after the wait)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from diag.api import diagnose, load_any
from diag.whatif import timeline as tl
from tests.unit.simulated_jobs import STRAGGLER_DRAWS, straggler_job

STRAGGLER_MS = 10.0
"""The straggler's extra time per step (the simulator adds it to its forward)."""
SPREAD_MS = 3.0
"""How far apart the ranks resume after the hidden wait: beyond the tolerance of resuming
together (2% of the ~11 ms gap), within half the arrival spread (~10 ms)."""
REPLAY_SLACK = 0.05
"""The range holds the measured saving within the replay's error."""


def _measured(root: Path, spread_ms: float) -> dict[str, Any]:
    """The straggler run's report and the saving measured by simulating without it."""
    from simulator import simulate
    from simulator.reshape import hide_waits

    steps: dict[str, float] = {}
    reports: dict[str, dict[str, Any]] = {}
    for name, inject in (("straggler", (f"straggler:rank=0,ms={STRAGGLER_MS:g}",)), ("ok", ())):
        out = root / f"{name}-{spread_ms:g}"
        simulate(straggler_job((4, 1, 1), seed=1, inject=inject), out, format="jsonl")
        hide_waits(out, "dp", resume_spread_ms=spread_ms, seed=3)
        _, reports[name] = diagnose(load_any(out))
        steps[name] = reports[name]["attribution"]["measured_step_s"]
    return {"report": reports["straggler"], "saving_s": steps["straggler"] - steps["ok"],
            "run": root / f"straggler-{spread_ms:g}"}  # fmt: skip


@pytest.fixture(scope="module")
def runs_apart(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _measured(Path(tmp_path_factory.mktemp("apart")), SPREAD_MS)


@pytest.fixture(scope="module")
def runs_together(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _measured(Path(tmp_path_factory.mktemp("together")), 0.0)


def _contains(low_high: list[float], value: float) -> bool:
    low, high = low_high
    return low * (1 - REPLAY_SLACK) <= value <= high * (1 + REPLAY_SLACK)


def test_an_ambiguous_gap_gives_a_range_that_holds_the_saving(runs_apart: dict[str, Any]) -> None:
    report, saving = runs_apart["report"], runs_apart["saving_s"]
    assert saving > 0.8 * STRAGGLER_MS / 1e3  # the straggler's excess reaches the step's end
    (cause,) = [c for c in report["attribution"]["causes"] if c["kind"] == "straggler"]
    assert cause["ranks"] == [0]
    assert _contains(cause["cost_range_s"], saving), (cause["cost_range_s"], saving)
    # read as each rank's own time the peers' gaps hide the straggler: the low end is far below
    assert cause["cost_range_s"][0] < 0.5 * saving
    blaming = [f for f in report["findings"] if f["ranks"] == [0] and f.get("cost_s") is not None]
    assert blaming
    for finding in blaming:
        assert _contains(finding["cost_range_s"], saving), (finding["rule"], saving)
        assert finding["cost_range_s"][0] == pytest.approx(finding["cost_s"])


def test_the_report_says_where_the_ambiguous_gaps_are(runs_apart: dict[str, Any]) -> None:
    report = runs_apart["report"]
    gaps = report["attribution"]["ambiguous_gaps"]
    peers = {g["rank"] for g in gaps if g["gap_s"] > 0.5 * STRAGGLER_MS / 1e3}
    assert peers == {1, 2, 3}
    assert {g["before"] for g in gaps} == {"all_reduce (cp)"}
    ranged = [f for f in report["findings"] if f.get("cost_range_s")]
    assert all("all_reduce (cp)" in f["evidence"]["cost_range_where"] for f in ranged)
    # the peers' own time in gaps is over a tenth of the step: said, with where it may wait
    for rank in (1, 2, 3):
        (note,) = [n for n in report["skipped"] if n.startswith(f"rank {rank}: ")]
        assert "in no record, read as its own work" in note
        assert "before all_reduce (cp) may be waiting" in note


def test_the_renderings_give_the_range(runs_apart: dict[str, Any]) -> None:
    from diag.outputs.report import render_html, render_markdown, render_text

    report = runs_apart["report"]
    (finding,) = [f for f in report["findings"] if f.get("cost_range_s")][:1]
    low, high = (f"{x * 1e3:.1f}" for x in finding["cost_range_s"])
    said = f"costs {low}-{high} ms per step"
    text = render_text(report)
    assert said in text and "      range: the time in no record" in text
    assert said in render_markdown(report)
    assert said in render_html(report)
    assert "(a range: gaps that may be waiting)" in text  # where the step goes


def test_resuming_together_gives_one_cost(runs_together: dict[str, Any]) -> None:
    """The same job whose ranks resume together: the gaps are waiting, the cost one figure."""
    report, saving = runs_together["report"], runs_together["saving_s"]
    assert "ambiguous_gaps" not in report["attribution"]
    assert not [c for c in report["attribution"]["causes"] if "cost_range_s" in c]
    assert not [f for f in report["findings"] if "cost_range_s" in f]
    first = report["findings"][0]
    assert (first["rule"], first["ranks"]) == ("BAL001", [0])
    assert first["cost_s"] == pytest.approx(saving, rel=0.2)


# derandomized: the same three draws on every run, so that CI reads the property, not the
# luck of the draw. A draw it misses is known (layout (4, 1, 2), rank 7, 5 ms, seed 8: the
# range [0, 16.7] ms against a 19.9 ms saving, at 94c649a as now); said in docs/metrics.md.
@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(**STRAGGLER_DRAWS)
def test_a_straggler_s_range_holds_what_removing_it_saves(
    layout: tuple[int, int, int], where: int, ms: float, seed: int
) -> None:
    """A straggler anywhere in a simulated dp x tp x pp job whose data-parallel waits are
    hidden and whose ranks resume up to 0.3x its excess apart after them: the straggler's
    cost range holds the saving measured by simulating the job without it."""
    from simulator import simulate
    from simulator.reshape import hide_waits

    dp, tp, pp = layout
    rank = where % (dp * tp * pp)
    steps: dict[str, float] = {}
    reports: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, inject in (("straggler", (f"straggler:rank={rank},ms={ms:g}",)), ("ok", ())):
            out = Path(tmp) / name
            simulate(straggler_job(layout, seed, inject), out, format="jsonl")
            hide_waits(out, "dp", resume_spread_ms=0.3 * ms, seed=seed)
            _, reports[name] = diagnose(load_any(out))
            steps[name] = reports[name]["attribution"]["measured_step_s"]
    saving = steps["straggler"] - steps["ok"]
    causes = reports["straggler"]["attribution"]["causes"]
    (cause,) = [c for c in causes if c["kind"] in ("straggler", "host") and c["ranks"] == [rank]]
    assert _contains(cause["cost_range_s"], saving), (cause["cost_range_s"], saving)


def _solo_run(runs: Any, starts_ms: list[float], ends_ms: list[float]) -> Path:
    """Three ranks of one data-parallel group: each leaves its recorded work at `starts_ms`
    (from the step's start), sits in no record until `ends_ms`, then calls an all-reduce of a
    one-member group (no recorded dependency) and a blocking all-reduce of the group that
    meets them again."""
    records: dict[int, list] = {0: [], 1: [], 2: []}
    meet = max(ends_ms) + 0.2
    for s in range(4):
        t = 100.0 * s
        for rank in records:
            start, end = t + starts_ms[rank], t + ends_ms[rank]
            solo = {"group": "solo", "group_size": 1, "async": False}
            dp = {"group": "dp", "group_size": 3, "async": False}
            records[rank] += [runs.span(s, "fwd", t, start),
                              runs.comm(s, end, end + 0.1, **solo),
                              runs.comm(s, end + 0.1, t + meet, **dp),
                              runs.span(s, "bwd", t + meet, t + 95),
                              runs.step(s, t, t + 100)]  # fmt: skip
    groups = {"dp": [[0, 1, 2]], "solo": [[0], [1], [2]]}
    return Path(runs.write(records, runs.manifest(3, groups=groups)))


@pytest.mark.parametrize(
    ("ends_ms", "reading"),
    [
        ([40.0, 40.05, 40.1], "waiting"),  # together, after the last came: they waited
        ([41.0, 45.0, 49.0], "ambiguous"),  # 8 ms apart where they came 30 ms apart
        ([50.0, 60.0, 80.0], "own"),  # as far apart as they came: work of their own
        ([30.0, 40.5, 41.0], "own"),  # one went on before the last came: not released by it
    ],
)
def test_how_a_gap_is_read(runs: Any, ends_ms: list[float], reading: str) -> None:
    """The ranks leave their work at 10, 20 and 40 ms; how their resuming reads."""
    run = load_any(_solo_run(runs, [10.0, 20.0, 40.0], ends_ms))
    own, waiting = tl.readings(run, run.steps)
    inferred = int(own.events["inferred"].sum())
    assert (waiting is not None) == (reading == "ambiguous")
    assert (inferred > 0) == (reading == "waiting")
    if reading == "ambiguous":
        assert waiting is not None and int(waiting.events["inferred"].sum()) == 3 * 4
        assert sorted(set(own.ambiguous["rank"])) == [0, 1, 2]
        assert set(own.ambiguous["before"]) == {"all_reduce (solo)"}
