"""The attribution of every step in chunks (diag/whatif/chunks.py): chunks cover every analysed
step, their causes combine as the docs say, a large run's records read again from its rank
files give what the records in memory give, and the budget's default says what it covers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diag.api import analyze_path, load_any
from diag.metrics import analysed_steps
from diag.metrics.host import host_steps
from diag.read import load
from diag.read.load import RunData
from diag.whatif import chunks
from diag.whatif.attribution import Attribution, attribute, attribute_chunk
from diag.whatif.causes import CauseKind

SIMULATED = ["--ranks", "16", "--layout", "dp=2,tp=2,pp=4", "--gpus-per-node", "8", "--steps",
             "24", "--microbatches", "4", "--layers", "4", "--hidden", "1024",
             "--inject", "straggler:rank=5,ms=20,from=14"]  # fmt: skip
SMALL_CHUNK_EVENTS = 3_000
"""About 5 steps of the run above a chunk: 4 chunks of its 23 analysed steps."""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chunks") / "run"
    subprocess.run([sys.executable, "-m", "diag", "simulate", *SIMULATED, "--out", str(out)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return out


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_EVENTS", SMALL_CHUNK_EVENTS)


def _attributed(run: RunData, replay_all: bool = True) -> Attribution:
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    attribution = attribute(run, steps, host_steps(steps), replay_all)
    assert attribution is not None
    return attribution


def test_every_analysed_step_is_replayed_in_chunks(run_dir: Path, small_chunks: None) -> None:
    run = load_any(run_dir)
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    plan = chunks.plan(run, steps, replay_all=True)
    assert len(plan.chunks) >= 3
    assert np.array_equal(np.concatenate(plan.chunks), np.sort(steps["step"].unique()))
    assert min(len(chunk) for chunk in plan.chunks) >= 2
    assert _attributed(run).steps_replayed == steps["step"].nunique()


def test_chunks_combine_weighted_by_their_steps(run_dir: Path, small_chunks: None) -> None:
    run = load_any(run_dir)
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    host = host_steps(steps)
    whole = _attributed(run)
    parts = [attribute(run, steps[steps["step"].isin(c)], host)
             for c in chunks.plan(run, steps, replay_all=True).chunks]  # fmt: skip
    assert all(p is not None and len(p.notes) == 0 for p in parts)
    weights = np.array([p.steps_replayed for p in parts if p is not None], dtype=float)
    mean = lambda values: float(np.dot(values, weights) / weights.sum())  # noqa: E731
    assert whole.measured_step_s == pytest.approx(mean([p.measured_step_s for p in parts]))
    assert whole.ideal_step_s == pytest.approx(mean([p.ideal_step_s for p in parts]))
    # a straggler from step 14 on: found in the later chunks only, its cost over every step
    # counts nothing in the chunks where it is not
    straggler = whole.cause(CauseKind.STRAGGLER, ranks=[5])
    assert straggler is not None
    found = [p.cause(CauseKind.STRAGGLER, ranks=[5]) for p in parts]
    assert found[0] is None and found[-1] is not None
    costs = [0.0 if c is None else c.cost_s for c in found]
    assert straggler.cost_s == pytest.approx(mean(costs))
    found_steps = sum(w for c, w in zip(found, weights, strict=True) if c is not None)
    assert straggler.evidence["found_in_steps"] == found_steps < whole.steps_replayed
    reaching = [c.evidence["reaching_step_end_s"] * w
                for c, w in zip(found, weights, strict=True) if c is not None]  # fmt: skip
    assert straggler.evidence["reaching_step_end_s"] == pytest.approx(sum(reaching) / found_steps)
    assert (
        f"{straggler.evidence['reaching_step_end_s'] * 1e3:.1f} ms of it reaches"
        in (straggler.evidence["explained"])
    )
    # per rank and group, the waiting per step over every step
    skew = pd.concat([p.waits.assign(w=w) for p, w in zip(parts, weights, strict=True)
                      if p is not None])  # fmt: skip
    expected = (skew["skew_s"] * skew["w"]).groupby([skew["rank"], skew["group"]]).sum()
    got = whole.waits.set_index(["rank", "group"])["skew_s"]
    assert np.allclose(got.to_numpy(), (expected / weights.sum()).loc[got.index].to_numpy())


def test_the_replay_error_is_the_median_over_every_step(run_dir: Path, small_chunks: None) -> None:
    run = load_any(run_dir)
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    plan = chunks.plan(run, steps, replay_all=True)
    with chunks.chunk_runs(run, plan.chunks) as run_of:
        parts = [attribute_chunk(run, run_of(i), steps[steps["step"].isin(c)], host_steps(steps))
                 for i, c in enumerate(plan.chunks)]  # fmt: skip
    errors = np.concatenate([p.errors for p in parts if p is not None])
    assert _attributed(run).replay_error == float(np.median(errors))


def test_records_read_again_from_the_rank_files_give_the_same_attribution(
    run_dir: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    in_memory = _attributed(load_any(run_dir))
    monkeypatch.setattr(load, "REDUCE_SPANS_FROM_BYTES", 0)  # a large run: a window kept
    reduced = load_any(run_dir)
    assert reduced.span_steps is not None and reduced.span_steps < reduced.steps["step"].max()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    again = _attributed(reduced)
    window = _attributed(reduced, replay_all=False)  # by default, the steps kept in memory
    analysed = reduced.steps["step"].nunique() - 1  # the warm-up step is not analysed
    assert window.steps_replayed == reduced.span_steps - 1 < analysed
    assert window.notes == [
        f"attribution replays the first {window.steps_replayed} of "
        f"{analysed} analysed steps (`diag analyze --replay all`: every step)"
    ]
    assert again.to_dict() == in_memory.to_dict()
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone
    # and any chunk may come from the files: a run that keeps 3 steps only
    assert _attributed(dataclasses.replace(reduced, span_steps=3)).to_dict() == again.to_dict()


def test_the_default_replays_a_budget_and_says_so(
    run_dir: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = load_any(run_dir)
    steps, _ = analysed_steps(run.steps, run.starts_at_warmup)
    assert _attributed(run, replay_all=False).steps_replayed == steps["step"].nunique()
    monkeypatch.setattr(chunks, "DEFAULT_REPLAY_EVENTS", 4 * SMALL_CHUNK_EVENTS)
    bounded = _attributed(run, replay_all=False)
    first = chunks.plan(run, steps, replay_all=False).chunks
    assert len(first) == 1 and bounded.steps_replayed == len(first[0])
    assert bounded.notes == [f"attribution replays the first {len(first[0])} of "
                             f"{steps['step'].nunique()} analysed steps "
                             "(`diag analyze --replay all`: every step)"]  # fmt: skip
    report = analyze_path(run_dir, replay_all=True)
    assert report["attribution"]["steps_replayed"] == steps["step"].nunique()


def test_worker_processes_give_what_one_process_gives(
    run_dir: Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = load_any(run_dir)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    two = _attributed(run)
    monkeypatch.setenv("DIAG_WORKERS", "1")
    assert _attributed(run).to_dict() == two.to_dict()


def test_diag_analyze_replay_all_replays_every_step(run_dir: Path, small_chunks: None) -> None:
    from click.testing import CliRunner

    from diag.cli.analyze import analyze

    steps, _ = analysed_steps(load_any(run_dir).steps, True)
    result = CliRunner().invoke(analyze, [str(run_dir), "--replay", "all", "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["attribution"]["steps_replayed"] == steps["step"].nunique()
    straggler = [c for c in report["attribution"]["causes"] if c["ranks"] == [5]]
    assert straggler and straggler[0]["evidence"]["found_in_steps"] < steps["step"].nunique()
