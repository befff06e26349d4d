"""The fast paths of diag.read.load (typed decoding, worker processes, the cache beside the run)
give exactly the tables of the line-by-line path."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from diag.metrics import reduce_rank_files
from diag.rankfile import rank_file, records
from diag.read import load, parallel, record_window
from diag.read.load import load_run

TABLES = ("steps", "spans", "comms", "memory", "experts", "events")


def _rich_rank(runs, rank: int) -> list[dict[str, Any] | str]:
    """Every record kind, with nulls, labels, flags and free event fields."""
    rows: list[dict[str, Any] | str] = [{"kind": "meta", "step": None, "rank": rank, "pid": 7}]
    for s in range(4):
        t = s * 100.0
        rows += [
            runs.span(s, "fwd", t, t + 30, mb=s % 2, stage=rank, chunk=0),
            runs.span(s, "bwd", t + 30, t + 70, mb=None, stage=None),
            runs.span(s, "comm_wait", t + 70, t + 75),
            runs.comm(
                s,
                t + 60,
                t + 75,
                tag="dp.bucket",
                dtype="float32",
                expected_bytes=1000,
                **{"async": True, "blocking": False},
            ),
            runs.comm(s, t + 76, t + 80, op="send", group="pp", bytes=None, layer=3),
            runs.mem(s, activations=None if s % 2 else 123, device_peak=None, source="tensors"),
            runs.experts(s, layer=rank, tokens=[5, 0, 7.5], dropped=1, capacity=8, aux_loss=1.1),
            {"kind": "event", "step": s, "name": "grad_norm", "local": 1.5, "global": 2.0},
            runs.step(s, t, t + 100, loss=2.0 - s / 10),
        ]
    return rows


@pytest.fixture
def rich_run(runs) -> Path:
    return runs.write({r: _rich_rank(runs, r) for r in range(3)}, runs.manifest(3))


def _line_by_line(monkeypatch: pytest.MonkeyPatch, run_dir: Path) -> load.RunData:
    with monkeypatch.context() as patch:
        patch.setattr(rank_file, "decode_rank_file", lambda data, columns: None)
        return load_run(run_dir)


def _assert_same(a: load.RunData, b: load.RunData) -> None:
    assert a.skipped == b.skipped
    for name in TABLES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), obj=name)


def test_typed_decoding_gives_the_line_by_line_tables(rich_run, monkeypatch) -> None:
    data = (rich_run / "rank-00001.jsonl").read_bytes()
    assert records.decode_rank_file(data, load.KEPT_COLUMNS) is not None  # the fast path is taken
    fast = load_run(rich_run)
    _assert_same(fast, _line_by_line(monkeypatch, rich_run))
    assert len(fast.spans) == 36 and len(fast.events) == 12
    assert fast.events["fields"].iloc[0] == {"local": 1.5, "global": 2.0}
    assert fast.steps["t0"].dtype == np.int64


@pytest.mark.parametrize(
    "line",
    [
        '{"kind":"span","step":0,"phase":"fwd","t0":1.5,"t1":2}',  # a float time
        '{"kind":"step","step":0,"t0":1,"t1":2,"loss":NaN}',  # NaN (not JSON)
        '{"kind":"future-kind","x":1}',  # a kind this version does not know
        '{"kind":"span","step":-1,"phase":"fwd","t0":1,"t1":2}',  # a negative step
        '{"kind":"span","step":0,"phase":"fwd","t0":1',  # truncated
        '{"kind":"comm","step":0,"op":"all_reduce","t0":1,"t1":2}',  # required fields missing
    ],
)
def test_lines_the_typed_decoder_refuses_go_line_by_line(runs, monkeypatch, line: str) -> None:
    rows = [*runs.simple_rank(3), line]
    run_dir = runs.write({0: rows, 1: runs.simple_rank(3)})
    assert (
        records.decode_rank_file((run_dir / "rank-00000.jsonl").read_bytes(), load.KEPT_COLUMNS)
        is None
    )
    _assert_same(load_run(run_dir), _line_by_line(monkeypatch, run_dir))


def test_reversed_times_are_noted_on_the_fast_path_as_on_the_slow(runs, monkeypatch) -> None:
    rows = [*runs.simple_rank(3), runs.span(1, "fwd", 50, 40), runs.comm(2, 90, 80)]
    run_dir = runs.write({0: rows})
    fast = load_run(run_dir)
    _assert_same(fast, _line_by_line(monkeypatch, run_dir))
    assert "rank-00000.jsonl: 1 record skipped (span record with t1 before t0)" in fast.skipped


def _pids_of(chunk: list[tuple[int, Path]]) -> list[tuple[int, str, int]]:
    return [(key, path.name, os.getpid()) for key, path in chunk]


def test_map_chunks_uses_worker_processes_and_keeps_order(tmp_path, monkeypatch) -> None:
    files = [(k, tmp_path / f"f{k}") for k in range(10)]
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    results = [row for chunk in parallel.map_chunks(_pids_of, files) for row in chunk]
    assert [(k, name) for k, name, _ in results] == [(k, p.name) for k, p in files]
    assert os.getpid() not in {pid for _, _, pid in results}
    monkeypatch.setenv("DIAG_WORKERS", "1")
    chunks = parallel.map_chunks(_pids_of, files)
    assert {pid for chunk in chunks for _, _, pid in chunk} == {os.getpid()}


def test_worker_processes_give_the_same_tables(rich_run, monkeypatch) -> None:
    one = load_run(rich_run)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    _assert_same(load_run(rich_run), one)


def test_pack_round_trip_keeps_values_order_and_inferred_type() -> None:
    columns = {
        "span": {
            "step": [0, 1, 2, 3],
            "phase": ["fwd", "bwd", "fwd", "fwd"],
            "mb": [0, None, 0, 0],
            "stage": [1, 1, 0, 0],
            "async": [True, True, False, True],
            "blocking": [True, None, True, True],
            "tokens": [[1], [2], [3], [4]],
            "name": ["a", "b", "c", "d"],
        }
    }
    parts = [records.pack(columns), records.pack(columns)]
    for name, values in columns["span"].items():
        merged = records.unpack([part["span"][name] for part in parts])
        # what pandas makes of it is what it makes of the plain list (ints + null -> float)
        pd.testing.assert_series_equal(pd.Series(merged), pd.Series(values + values), obj=name)
    assert isinstance(parts[0]["span"]["phase"], records.Encoded)
    assert isinstance(parts[0]["span"]["step"], np.ndarray)
    assert isinstance(parts[0]["span"]["name"], list)  # all distinct: not worth a dictionary


def test_a_large_run_keeps_a_window_of_spans_and_the_same_analysis(runs, monkeypatch) -> None:
    from diag.api import diagnose

    rows = {r: [*_rich_rank(runs, r), *runs.simple_rank(12)[12:]] for r in range(3)}
    for r in rows:  # steps 4..11 of fwd/bwd, and an orphan span of a step never recorded
        rows[r] = [row for row in rows[r] if not (isinstance(row, dict) and row.get("step") == 4
                   and row["kind"] == "step")]  # fmt: skip
        rows[r].append(runs.span(40, "fwd", 4000, 4010))
    run_dir = runs.write(rows, runs.manifest(3))
    full = load_run(run_dir)
    monkeypatch.setattr(load, "REDUCE_SPANS_FROM_BYTES", 0)
    monkeypatch.setattr(record_window, "SPAN_WINDOW_STEPS", 2)
    reduced = load_run(run_dir, breakdown=reduce_rank_files)
    assert full.span_steps is None and full.rank_steps is None
    assert reduced.span_steps == 2 and reduced.rank_steps is not None
    kept = reduced.spans
    assert len(kept) < len(full.spans)
    outside = kept[kept["step"] >= 2]
    assert set(outside["phase"]) <= {"comm_wait", "fwd", "bwd"}
    assert set(outside.loc[outside["phase"] != "comm_wait", "step"]) == {4, 40}  # no step record
    assert (full.spans["phase"] == "comm_wait").sum() == (kept["phase"] == "comm_wait").sum()
    assert set(reduced.comms["step"]) == {0, 1}  # collectives too: a window of records
    assert reduced.comm_totals is not None and set(reduced.comm_totals["step"]) == set(
        full.comms["step"]
    )
    # what is measured on every record (the time breakdown, the collectives' sums) is the
    # same; the replay and the rules matching records across ranks see the window in both
    full = dataclasses.replace(full, span_steps=reduced.span_steps)
    metrics_full, report_full = diagnose(full)
    metrics_reduced, report_reduced = diagnose(reduced)
    pd.testing.assert_frame_equal(metrics_full.rank_steps, metrics_reduced.rank_steps)
    pd.testing.assert_frame_equal(metrics_full.collectives, metrics_reduced.collectives)
    assert report_full == report_reduced


@pytest.mark.parametrize("reduce", [False, True])
def test_a_window_of_steps_is_read_and_analysed_alone(runs, monkeypatch, reduce: bool) -> None:
    from diag.api import analyze_path

    run_dir = runs.write({r: _rich_rank(runs, r) for r in range(3)}, runs.manifest(3))
    if reduce:
        monkeypatch.setattr(load, "REDUCE_SPANS_FROM_BYTES", 0)
    window = load_run(run_dir, steps=range(1, 3), breakdown=reduce_rank_files)
    for name in TABLES:
        assert set(getattr(window, name)["step"]) == {1, 2}, name
    assert not window.starts_at_warmup
    assert any("only steps 1:3 read" in note for note in window.skipped)
    report = analyze_path(run_dir, steps=range(1, 3))
    assert report["summary"]["steps_analysed"] == 2  # step 1 is not a warm-up step here
    assert report["summary"]["warmup_steps_excluded"] == 0
    whole = analyze_path(run_dir)
    assert whole["summary"]["steps_analysed"] == 3  # steps 1-3; step 0 is the warm-up


def test_cli_steps_window_and_its_errors(runs, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from diag.cli.main import main

    run_dir = runs.write({r: _rich_rank(runs, r) for r in range(2)}, runs.manifest(2))
    result = CliRunner().invoke(
        main, ["analyze", str(run_dir), "--steps", "2:", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    for bad in ("5:2", "x", "3"):
        result = CliRunner().invoke(main, ["analyze", str(run_dir), "--steps", bad])
        assert result.exit_code == 2 and "--steps" in result.output
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank0.1.pt.trace.json").write_text('{"traceEvents": []}')
    result = CliRunner().invoke(main, ["analyze", str(traces), "--steps", "1:2"])
    assert result.exit_code == 2 and "--steps is for run directories" in result.output


def test_chunks_cover_the_files_in_order_largest_first() -> None:
    for items, count, most in ((1024, 2, 64), (16384, 2, 64), (10, 2, 64), (7, 3, 1), (0, 2, 64)):
        bounds = parallel.chunk_bounds(items, count, most)
        assert [a for a, _ in bounds] == [0, *(b for _, b in bounds[:-1])][: len(bounds)]
        assert (bounds[-1][1] if bounds else 0) == items
        sizes = [b - a for a, b in bounds]
        assert all(1 <= size <= most for size in sizes)
        assert sizes == sorted(sizes, reverse=True)
    assert parallel.chunk_bounds(1024, 2, 64)[-2:] == [(1018, 1022), (1022, 1024)]
