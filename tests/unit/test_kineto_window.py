"""A large trace folder is reduced as a large run directory is (issue 43, kineto/window.py):
every step's time breakdown and collective totals, the records for a window of first steps,
and the same analysis as the whole folder's read with that window."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import diag.read.kineto as kineto
from diag.api import diagnose
from diag.metrics import comm_totals
from diag.metrics.file_reduction import reduce_rank_files
from diag.rankfile.records import Encoded
from diag.read import record_window
from diag.read.kineto import load_trace_dir, spill, window
from diag.read.kineto.packed_comms import Message, PackedComms
from diag.read.load import RunData
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


def _tables(run: RunData) -> dict[str, pd.DataFrame]:
    return {"steps": run.steps, "spans": run.spans, "comms": run.comms,
            "rank_steps": run.rank_steps, "comm_totals": run.comm_totals}  # fmt: skip


def test_traces_reduced_by_workers_from_disk_give_the_tables_reduced_in_memory(
    traces: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The workers write each trace's records to disk and reduce them once the layout is
    known (spill.py, window.reduce_spilled): the same tables as the gathering process's own
    reduction, in forked workers, and nothing left on disk."""
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", 0)
    monkeypatch.setattr(record_window, "SPAN_WINDOW_STEPS", WINDOW)
    monkeypatch.setattr(window, "SPILLED_PARALLEL_FROM_BYTES", 0)
    spilled, log = tmp_path / "spilled", tmp_path / "written.txt"
    spilled.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spilled))
    real_write = spill.write

    def logged(path: Path, *args: Any) -> bool:  # in the worker processes: logged to a file
        with log.open("a") as out:
            out.write(f"{path}\n")
        return real_write(path, *args)

    monkeypatch.setattr(spill, "write", logged)
    from_disk = load_trace_dir(traces, use_cache=False, workers=2, breakdown=reduce_rank_files)
    written = log.read_text().splitlines()
    assert len(written) == len(list(traces.glob("*.json"))) and not list(spilled.iterdir())
    monkeypatch.setattr(spill, "write", lambda *_: False)  # kept in memory, as before
    in_memory = load_trace_dir(traces, use_cache=False, workers=2, breakdown=reduce_rank_files)
    for name, table in _tables(in_memory).items():
        pd.testing.assert_frame_equal(_tables(from_disk)[name], table, obj=name)
    assert from_disk.skipped == in_memory.skipped


def test_a_spilled_trace_reads_back_as_written(tmp_path: Path) -> None:
    steps = [{"rank": 1, "step": s, "t0": 10 * s, "t1": 10 * s + 5} for s in range(3)]
    spans = {
        "t0": np.arange(3, dtype=np.int64),
        "phase": Encoded(["kernel", None], np.array([0, 1, 0])),
    }
    comms = PackedComms(
        {"op": Encoded(["send"], np.zeros(2, dtype=np.int32)), "bytes": np.array([1.0, np.nan]),
         "async": [True, None]},
        [(0, 1), None], np.array([0, 1], dtype=np.int32),
        {"peer": Message(np.array([0, 3]), np.array([True, False])), "seq": [None, 2]},
    )  # fmt: skip
    path = tmp_path / "0.npz"
    assert spill.write(path, steps, spans, comms)
    read_steps, read_spans, read_comms = spill.read(path)
    np.testing.assert_array_equal(read_steps["t1"], [5, 15, 25])
    assert read_spans["phase"].values == ["kernel", None]
    np.testing.assert_array_equal(read_comms.columns["bytes"], [1.0, np.nan])
    assert read_comms.columns["async"] == [True, None] and read_comms.members == [(0, 1), None]
    assert read_comms.messages["seq"] == [None, 2]
    peer = read_comms.messages["peer"]
    assert isinstance(peer, Message) and peer.null.tolist() == [True, False]
    # a value JSON would not give back as it was: not written, the trace stays in memory
    odd = dataclasses.replace(comms, columns={**comms.columns, "async": [(1, 2)]})
    assert not spill.write(tmp_path / "1.npz", steps, spans, odd)
    assert not (tmp_path / "1.npz").exists()


def test_a_gzipped_folder_is_large_by_its_text_not_its_size_on_disk(
    traces: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "gzipped"
    folder.mkdir()
    for trace in traces.glob("*.json"):
        (folder / f"{trace.name}.gz").write_bytes(gzip.compress(trace.read_bytes()))
    on_disk = sum(p.stat().st_size for p in folder.iterdir())
    text = sum(p.stat().st_size for p in traces.glob("*.json"))
    assert text > 3 * on_disk
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", (on_disk + text) // 2)
    run = load_trace_dir(folder, use_cache=False, workers=1, breakdown=reduce_rank_files)
    assert run.rank_steps is not None  # reduced: its JSON passes the threshold
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", text + 1)
    run = load_trace_dir(folder, use_cache=False, workers=1, breakdown=reduce_rank_files)
    assert run.rank_steps is None


def test_a_gzip_cut_short_is_not_large_by_its_trailer(tmp_path: Path) -> None:
    """A gzipped trace cut short (a job killed while its profiler wrote it) ends in compressed
    data, not the inflated size: read as one, its four bytes called a 30 KB folder large."""
    whole = gzip.compress(b'{"traceEvents": [' + b'{"ph": "X", "ts": 1},' * 3000 + b"{}]}")
    cut = whole[:1100] + (2**31).to_bytes(4, "little")  # what the trailer's place holds
    (tmp_path / "whole.json.gz").write_bytes(whole)
    (tmp_path / "cut.json.gz").write_bytes(cut)
    sizes = kineto._text_sizes([tmp_path / "whole.json.gz", tmp_path / "cut.json.gz"])
    assert sizes == [len(gzip.decompress(whole)), len(cut)]


def test_a_trace_that_cannot_be_spilled_stays_in_memory(tmp_path: Path) -> None:
    steps = [{"rank": 0, "step": 0, "t0": 0, "t1": 5}]
    comms = PackedComms({"t0": np.zeros(1, dtype=np.int64)}, [None], np.zeros(1, np.int32), {})
    gone = tmp_path / "gone" / "0.npz"  # its folder removed: nothing written, no error
    assert not spill.write(gone, steps, {"t0": np.zeros(1, dtype=np.int64)}, comms)
