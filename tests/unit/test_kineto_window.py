"""A large trace folder is reduced as a large run directory is (issue 43, kineto/window.py):
every step's time breakdown and collective totals, the records for a window of first steps,
and the same analysis as the whole folder's read with that window."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import diag.read.kineto as kineto
from diag.api import diagnose
from diag.metrics import comm_totals
from diag.metrics.file_reduction import reduce_rank_files
from diag.read import record_window
from diag.read.kineto import load_trace_dir
from tests.unit.simulated_jobs import trace_folder

WINDOW = 3


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace_folder(tmp_path_factory, "window", steps=8)


def test_a_large_folder_keeps_a_window_and_gives_the_same_analysis(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = load_trace_dir(traces, use_cache=False, workers=1)
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", 0)
    monkeypatch.setattr(record_window, "SPAN_WINDOW_STEPS", WINDOW)
    reduced = load_trace_dir(traces, use_cache=False, workers=1, breakdown=reduce_rank_files)
    first = int(full.steps["step"].min())
    assert full.span_steps is None and full.rank_steps is None
    assert reduced.span_steps == first + WINDOW and reduced.rank_steps is not None
    assert len(reduced.comms) < len(full.comms) and len(reduced.spans) < len(full.spans)
    assert set(reduced.comms["step"]) == set(range(first, first + WINDOW))
    window = full.comms[full.comms["step"] < first + WINDOW].reset_index(drop=True)
    pd.testing.assert_frame_equal(reduced.comms, window)  # peer and seq cut with the rest
    kept = reduced.spans[reduced.spans["phase"] != "comm_wait"]
    assert set(kept["step"]) == set(range(first, first + WINDOW))
    assert (full.spans["phase"] == "comm_wait").sum() == (
        reduced.spans["phase"] == "comm_wait"
    ).sum()
    assert any("the spans and collectives themselves for steps" in n for n in reduced.skipped)
    assert reduced.comm_totals is not None
    assert set(reduced.comm_totals["step"]) == set(full.comms["step"])
    # every step measured alike; the replay and the rules matching records see the window
    full = dataclasses.replace(full, span_steps=reduced.span_steps)
    metrics_full, report_full = diagnose(full)
    metrics_reduced, report_reduced = diagnose(reduced)
    pd.testing.assert_frame_equal(metrics_full.rank_steps, metrics_reduced.rank_steps)
    pd.testing.assert_frame_equal(metrics_full.collectives, metrics_reduced.collectives)
    report_reduced["skipped"] = [
        n for n in report_reduced["skipped"] if "the spans and collectives themselves" not in n
    ]
    assert report_full == report_reduced


def test_a_folder_without_the_breakdown_keeps_every_record(
    traces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", 0)
    run = load_trace_dir(traces, use_cache=False, workers=1)
    assert run.span_steps is None and run.rank_steps is None


def test_collective_sums_in_numpy_are_the_compiled_loops() -> None:
    rng = np.random.default_rng(7)
    rows, space = 20_000, 300
    key = rng.integers(0, space, rows)
    sent = rng.integers(0, 2**40, rows).astype(np.float64)
    sent[rng.random(rows) < 0.2] = np.nan
    expected = rng.integers(0, 2**40, rows).astype(np.float64)
    expected[rng.random(rows) < 0.5] = np.nan
    t0 = rng.integers(0, 2**50, rows)
    t1 = t0 + rng.integers(0, 2**30, rows)
    loop = comm_totals._summed_by_key(key, space, sent, expected, t0, t1)
    vectorised = comm_totals._summed_in_numpy(key, space, sent, expected, t0, t1)
    for ours, theirs in zip(vectorised, loop, strict=True):
        assert ours.dtype == theirs.dtype
        np.testing.assert_array_equal(ours, theirs)


def test_replaying_every_step_of_a_large_folder_keeps_every_record(
    traces: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from diag.api import analyze_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", 0)
    monkeypatch.setattr(record_window, "SPAN_WINDOW_STEPS", WINDOW)
    folder = tmp_path / "traces"
    shutil.copytree(traces, folder)
    windowed = analyze_path(folder)
    every = analyze_path(folder, replay_all=True)  # record_spill reads rank files: not here
    assert any("themselves for steps" in note for note in windowed["skipped"])
    assert not any("themselves for steps" in note for note in every["skipped"])
