"""A growing run analysed incrementally (`diag.LiveRun`, diag/metrics/live.py): each finished step's
records are taken in once and become its rows of the per-step tables; after N steps the tables are
those of a from-scratch load of the same N steps (the loader's reduced form, which a large run gets:
every step's breakdown and collective totals, records kept for a window of first steps; of a run as
small as the loader keeps whole, every record) to the bit, and the findings are the same. With a
window (`diag watch`) the tables are those of the window's steps. The growing tables keep the frames
read before them intact.

The run is simulated, then re-written step by step as a job writes it (whole lines appended).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag import LiveRun, RunTail, diagnose
from diag.contract import schema
from diag.metrics import compute_metrics, epochs, reduce_rank_files
from diag.metrics.common import analysed_steps
from diag.metrics.growing_table import GrowingTable
from diag.metrics.time_breakdown import time_breakdown
from diag.read import load
from diag.whatif import chunks
from simulator import ModelSpec, SimConfig, simulate

SMALL = {"layers": 4, "hidden": 256, "heads": 8, "seq_len": 512, "vocab": 4096}
SORT = ["rank", "step", "op", "group", "tag", "group_size", "layer", "t0", "t1"]


class Growing:
    """A simulated run re-written into `folder` a step at a time (its manifest `running`)."""

    def __init__(self, source: Path, folder: Path) -> None:
        folder.mkdir()
        manifest = json.loads((source / schema.MANIFEST_FILE).read_text())
        manifest["status"] = schema.RunStatus.RUNNING.value
        (folder / schema.MANIFEST_FILE).write_text(json.dumps(manifest))
        self.lines: dict[Path, list[list[str]]] = {}
        for path in sorted(source.glob("rank-*.jsonl")):
            steps: list[list[str]] = [[]]
            for line in path.read_text().splitlines(keepends=True):
                steps[-1].append(line)
                if '"kind":"step"' in line:
                    steps.append([])
            self.lines[folder / path.name] = steps
            (folder / path.name).write_text("")
        self.written = 0

    def grow(self, steps: int) -> None:
        for path, lines in self.lines.items():
            with path.open("a") as fh:
                for step in lines[self.written : self.written + steps]:
                    fh.writelines(step)
        self.written += steps


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = SimConfig(
        model=ModelSpec(**SMALL), dp=2, tp=2, pp=2, microbatches=4, steps=24,
        inject=("straggler:rank=3,ms=30,from=12",),
    )  # fmt: skip
    return simulate(config, tmp_path_factory.mktemp("sim") / "run", format="jsonl").path


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [name for name in SORT if name in frame.columns]
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


def _findings(report: dict[str, object]) -> list[tuple[object, ...]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [(f["rule"], tuple(f["ranks"]), f["severity"]) for f in findings]


def _rounded(value: object) -> object:
    """`value` with every float to 12 significant digits (nested lists and dicts too)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(item) for item in value]
    return value


@pytest.mark.parametrize(
    ("chunks", "large"),
    [([24], True), ([1] * 24, True), ([3, 1, 5, 2, 9, 4], True), ([3, 1, 5, 2, 9, 4], False)],
)
def test_after_each_step_the_tables_and_findings_are_a_from_scratch_analysis(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[int], large: bool
) -> None:
    """`large`: the rank files count as large (the loader's REDUCE_SPANS_FROM_BYTES set to 0),
    so both ways keep the records of a window of first steps; else both keep every record."""
    if large:
        monkeypatch.setattr(load, "REDUCE_SPANS_FROM_BYTES", 0)
    growing = Growing(source, tmp_path / "run")
    live = LiveRun(tmp_path / "run")
    for size in chunks:
        growing.grow(size)
        manifest = live.manifest()
        assert manifest is not None
        assert live.update(manifest) == growing.written - 1
        if growing.written not in (1, 2, 3, 8, 9, 13, 24) and size == 1:
            continue
        run = live.run()
        scratch = load.load_run(tmp_path / "run", breakdown=reduce_rank_files)
        assert run.span_steps == scratch.span_steps and (run.span_steps is None) != large
        measured = compute_metrics(scratch)  # a small run's per-step tables: the metrics'
        for name in ("steps", "memory", "experts", "rank_steps", "comm_totals", "comms"):
            expected_table = getattr(scratch, name)
            if expected_table is None:
                expected_table = getattr(measured, name)
            pd.testing.assert_frame_equal(
                _sorted(getattr(run, name)), _sorted(expected_table),
                check_exact=True, obj=f"{name} after {growing.written} steps",
            )  # fmt: skip
        spans = scratch.spans
        if large:  # the loader keeps every comm_wait span too
            spans = spans[spans["step"] < scratch.span_steps]
        pd.testing.assert_frame_equal(_sorted(run.spans), _sorted(spans), check_exact=True)
        report = diagnose(run, derived=live.derived())[1]
        expected = diagnose(scratch)[1]
        assert _findings(report) == _findings(expected)
        for key, value in expected["summary"].items():  # sums in another order: to 1e-12
            close = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
            assert report["summary"][key] == close, key
    assert any(rule == "BAL001" and 3 in ranks for rule, ranks, _ in _findings(report))


def test_a_step_is_taken_in_once_and_its_records_dropped(source: Path, tmp_path: Path) -> None:
    growing = Growing(source, tmp_path / "run")
    live = LiveRun(tmp_path / "run")
    growing.grow(5)
    manifest = live.manifest()
    assert manifest is not None
    assert live.update(manifest) == 4
    assert all(not rows for rows in live.tail.records.values())
    assert live.update(manifest) is None  # nothing new: nothing taken in, nothing to analyse
    rows = len(live.run().steps)
    growing.grow(1)
    assert live.update(manifest) == 5
    assert len(live.run().steps) == rows + manifest.world_size


def test_a_window_holds_the_last_steps_as_a_load_of_them(source: Path, tmp_path: Path) -> None:
    growing = Growing(source, tmp_path / "run")
    live = LiveRun(tmp_path / "run", window_steps=4)
    for _ in range(15):
        growing.grow(1)
        manifest = live.manifest()
        assert manifest is not None
        live.update(manifest)
    run = live.run()
    scratch = load.load_run(tmp_path / "run", steps=range(11, 15))
    assert sorted(run.steps["step"].unique()) == [11, 12, 13, 14]
    assert not run.starts_at_warmup and run.span_steps is None
    windows = analysed_steps(scratch.steps, scratch.starts_at_warmup)[0]
    expected = time_breakdown(scratch.spans, scratch.comms, windows)
    assert run.rank_steps is not None
    pd.testing.assert_frame_equal(_sorted(run.rank_steps), _sorted(expected), check_exact=True)
    for name in ("spans", "comms", "steps"):
        pd.testing.assert_frame_equal(_sorted(getattr(run, name)), _sorted(getattr(scratch, name)))
    assert compute_metrics(run).summary["steps_analysed"] == 4
    assert len(live._tables["steps"]) <= 2 * 4 * manifest.world_size  # older rows dropped


def test_the_watch_window_judges_as_the_records_window_did(source: Path, tmp_path: Path) -> None:
    """`diag watch` read the window's records again at every step (`RunTail.window`, polled as
    the run grows); from the kept tables it finds the same findings at every step, the
    straggler's onset included."""
    growing = Growing(source, tmp_path / "run")
    live = LiveRun(tmp_path / "run", window_steps=6)
    records = RunTail(tmp_path / "run", window_steps=6)
    named = []
    for _ in range(24):
        growing.grow(1)
        manifest = live.manifest()
        assert manifest is not None
        last = live.update(manifest)
        assert last is not None
        records.poll(manifest)
        expected = diagnose(records.window(manifest, last))[1]
        found = diagnose(live.run(), derived=live.derived())[1]
        assert _findings(found) == _findings(expected), last
        named += [last for rule, ranks, _ in _findings(found) if rule == "BAL001" and 3 in ranks]
    assert named and min(named) >= 12  # the straggler starts at step 12: never named before


@pytest.mark.parametrize("window", [None, 5])
def test_the_live_diagnosis_after_each_step_is_a_from_scratch_one(
    tmp_path_factory: pytest.TempPathFactory, window: int | None
) -> None:
    """What the live view shows after N steps (`diagnose(run(), derived=derived())`: PIT001 from
    the epoch orders kept as the steps came) is the from-scratch diagnosis of the same N steps
    (of the window's, with `window_steps`): every finding with its evidence, the summary and the
    per-rank table. The run
    forgets `set_epoch` (PIT001 fires once two epochs are seen) and grows memory (TRD002)."""
    config = SimConfig(
        model=ModelSpec(**SMALL), dp=2, tp=2, pp=1, microbatches=2, steps=20,
        inject=("no-set-epoch", "leak:mb=40"),
    )  # fmt: skip
    root = tmp_path_factory.mktemp("forgetful")
    source = simulate(config, root / "run", format="jsonl").path
    growing = Growing(source, root / "growing")
    live = LiveRun(root / "growing", window_steps=window)
    fired = []
    for size in [1, 1, 1, 2, 1, 3, 1, 1, 4, 5]:
        growing.grow(size)
        manifest = live.manifest()
        assert manifest is not None
        last = live.update(manifest)
        assert last == growing.written - 1
        run = live.run()
        steps = range(max(0, last - window + 1), last + 1) if window else None
        scratch = load.load_run(root / "growing", steps=steps, breakdown=reduce_rank_files)
        kept = epochs.last_orders(epochs.epoch_orders(run.events))
        derived = live.derived()[epochs.DERIVED_NAME]
        assert len(derived) == len(kept)  # the same (rank, epoch)s, the same hashes apart
        pairs = derived[["rank", "epoch"]].reset_index(drop=True)
        pd.testing.assert_frame_equal(pairs, kept[["rank", "epoch"]].reset_index(drop=True))
        report = diagnose(run, derived=live.derived())[1]
        expected = diagnose(scratch)[1]
        for part in ("findings", "summary", "ranks"):  # sums in another order: to 12 digits
            assert _rounded(report[part]) == _rounded(expected[part]), (last, part)
        fired += [f["rule"] for f in report["findings"] if f["rule"] in ("PIT001", "TRD002")]
    assert {"PIT001", "TRD002"} <= set(fired)  # PIT001 judged from the kept orders fires


def test_a_growing_table_keeps_what_was_read_before() -> None:
    table = GrowingTable()
    table.append(pd.DataFrame({"step": [0, 0], "op": pd.Categorical(["send", None]),
                               "bytes": [1.0, 2.0]}))  # fmt: skip
    before = table.frame()
    for step in range(1, 600):  # past the first capacity: the columns are doubled
        table.append(pd.DataFrame({"step": [step] * 2, "op": pd.Categorical(["all_reduce", "send"]),
                                   "bytes": [3.0, 4.0]}))  # fmt: skip
    assert before["op"].iloc[0] == "send" and pd.isna(before["op"].iloc[1])  # kept its codes
    assert list(before["op"].cat.categories) == ["send"]
    every = table.frame()
    assert len(every) == 2 + 599 * 2 and list(every["op"].cat.categories) == ["all_reduce", "send"]
    assert every["op"].iloc[:4].tolist()[2:] == ["all_reduce", "send"] and pd.isna(every["op"][1])
    assert every["bytes"].tolist()[:4] == [1.0, 2.0, 3.0, 4.0]
    recent = table.frame(598)
    assert recent["step"].tolist() == [598, 598, 599, 599]
    table.drop_before(598)
    assert len(table) == 4 and table.frame()["step"].tolist() == [598, 598, 599, 599]
    assert recent["step"].tolist() == [598, 598, 599, 599]


def test_a_long_series_trend_is_fitted_on_medians_of_runs() -> None:
    """TRD001 over a whole long run (what the live dashboard judges every step): the
    Theil-Sen fit of 5,000 points, on 512 medians, finds the slope the pairwise fit finds."""
    from diag.rules.families.trend import MAX_TREND_POINTS, theil_sen

    rng = np.random.default_rng(0)
    x = np.arange(5_000, dtype=float)
    y = 0.5 + 2e-5 * x + rng.normal(0, 0.01, len(x))
    exact = theil_sen(x[::10], y[::10], 1.96)  # 500 points: fitted pairwise
    fitted = theil_sen(x, y, 1.96)
    assert len(x) > MAX_TREND_POINTS and exact is not None and fitted is not None
    assert fitted.per_step == pytest.approx(2e-5, rel=0.05)
    assert fitted.per_step == pytest.approx(exact.per_step, rel=0.05)
    assert 0 < fitted.lower < fitted.per_step
    flat = theil_sen(x, 0.5 + rng.normal(0, 0.01, len(x)), 1.96)
    assert flat is not None and flat.lower <= 0  # no trend: none found


def test_a_finished_chunk_is_not_replayed_again(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attribution replays a growing run in chunks of steps that do not move as it grows;
    the live view replays only the chunks that changed (`ReplayMemo` in `derived()`), and its
    attribution is the from-scratch one of the same steps."""
    monkeypatch.setattr(chunks, "CHUNK_EVENTS", 1_500)  # a few steps a chunk
    growing = Growing(source, tmp_path / "run")
    live = LiveRun(tmp_path / "run")
    for size in [9, 1, 1, 4, 1, 8]:
        growing.grow(size)
        manifest = live.manifest()
        assert manifest is not None
        live.update(manifest)
        run = live.run()
        metrics, report = diagnose(run, derived=live.derived())
        scratch = load.load_run(tmp_path / "run", breakdown=reduce_rank_files)
        expected_metrics, expected = diagnose(scratch)
        assert _findings(report) == _findings(expected)
        for key, value in expected["summary"].items():  # sums in another order: to 1e-9
            close = pytest.approx(value, rel=1e-9) if isinstance(value, float) else value
            assert report["summary"][key] == close, key
        attribution, expected_attribution = metrics.attribution, expected_metrics.attribution
        assert attribution is not None and expected_attribution is not None
        assert attribution.to_dict() == expected_attribution.to_dict()  # the replays: exact
    plan = chunks.plan(run, analysed_steps(run.steps, run.starts_at_warmup)[0], replay_all=False)
    assert len(plan.chunks) >= 4
    assert live.derived()[chunks.MEMO_NAME].hits >= 4
