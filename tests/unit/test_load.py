"""diag.read.load: tables from a run dir, InputError for unusable input, notes for partial input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from diag.errors import InputError
from diag.read import load
from diag.read.load import load_run

B = 1_700_000_000_000_000_000


def test_input_error_is_one_line_path_and_reason() -> None:
    err = InputError(Path("/x/run"), "no such\nfile")
    assert str(err) == "/x/run: no such file"
    assert (err.path, err.reason) == ("/x/run", "no such file")


def test_golden_tables(golden_dp2: Path) -> None:
    run = load_run(golden_dp2)
    assert run.skipped == []
    assert run.manifest.run_id == "dp2-golden"
    assert len(run.steps) == 6 and len(run.spans) == 24 and len(run.comms) == 8
    assert len(run.memory) == 6 and run.experts.empty and run.events.empty
    assert sorted(run.steps["rank"].unique()) == [0, 1]
    # ns timestamps near 1.7e18 stay exact int64 (a float64 would round them to 256 ns)
    assert str(run.steps["t0"].dtype) == "int64"
    assert run.steps.loc[(run.steps["rank"] == 1) & (run.steps["step"] == 2), "t0"].item() == (
        B + 210_000_000
    )
    assert list(run.spans.columns) == list(load.SPAN_COLUMNS)


def test_empty_tables_keep_their_columns(runs) -> None:
    run = load_run(runs.write({0: [runs.step(0, 0, 10)]}, runs.manifest(1)))
    for frame, columns in [
        (run.spans, load.SPAN_COLUMNS),
        (run.comms, load.COMM_COLUMNS),
        (run.memory, load.MEMORY_COLUMNS),
        (run.experts, load.EXPERTS_COLUMNS),
        (run.events, load.EVENT_COLUMNS),
    ]:
        assert frame.empty and tuple(frame.columns) == columns


def test_unknown_kinds_and_fields_are_ignored_silently(runs) -> None:
    rows = [
        {"kind": "meta", "rank": 0, "pid": 1},
        {"kind": "future-kind", "x": 1},
        runs.step(0, 0, 10, shiny_new_field=3),
        {"kind": "event", "step": 0, "name": "oom", "params": 5},
    ]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == []
    assert len(run.steps) == 1 and "shiny_new_field" not in run.steps.columns
    assert run.events.loc[0, "fields"] == {"params": 5}


# --- Fatal: InputError naming the file ---------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file or directory") as info:
        load_run(tmp_path / "nope")
    assert info.value.path == str(tmp_path / "nope")


def test_a_file_instead_of_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(InputError, match="is a file, not a run directory"):
        load_run(tmp_path / "f.json")


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"neither manifest.json nor .*pt.trace.json") as info:
        load_run(tmp_path)
    assert info.value.path == str(tmp_path)


@pytest.mark.parametrize("name", ["rank0.pt.trace.json", "host_123.1.pt.trace.json.gz"])
def test_a_trace_folder_is_not_a_run_directory(tmp_path: Path, name: str) -> None:
    data = b'{"traceEvents": []}'
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(InputError, match=r"named like profiler traces .* but no manifest\.json"):
        load_run(tmp_path)


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"schema": "other/2", "world_size": 2}), "schema is 'other/2'"),
        (json.dumps({"schema": "diag.run/1", "world_size": "two"}), "world_size is 'two'"),
        (json.dumps({"schema": "diag.run/1", "world_size": 2, "ranks": [3]}), "not a JSON object"),
        (json.dumps({"schema": "diag.run/1", "world_size": 1, "layout": {"pp": "4"}}), "layout.pp"),
    ],
)
def test_bad_manifest(runs, manifest: str, reason: str) -> None:
    run_dir = runs.write({0: [runs.step(0, 0, 10)]}, manifest)
    with pytest.raises(InputError, match=reason) as info:
        load_run(run_dir)
    assert info.value.path == str(run_dir / "manifest.json")


def test_no_rank_file(runs) -> None:
    run_dir = runs.write({}, runs.manifest(4))
    with pytest.raises(InputError, match=r"no rank files .* ranks 0\.\.3"):
        load_run(run_dir)


def test_only_rank_files_outside_the_world(runs) -> None:
    with pytest.raises(InputError, match="no rank files"):
        load_run(runs.write({5: [runs.step(0, 0, 10)]}, runs.manifest(2)))


# --- Partial: skipped with a note naming the file -----------------------------------------------


def test_missing_rank_file(runs) -> None:
    run = load_run(runs.write({r: runs.simple_rank() for r in (0, 1, 2)}, runs.manifest(4)))
    assert run.skipped == ["rank-00003.jsonl: missing (rank 3 of 4 not analysed)"]
    assert sorted(run.steps["rank"].unique()) == [0, 1, 2]


def test_rank_file_outside_the_world(runs) -> None:
    run = load_run(runs.write({0: runs.simple_rank(), 7: runs.simple_rank()}, runs.manifest(1)))
    assert run.skipped == ["rank-00007.jsonl: rank 7 is outside the world of 1, ignored"]
    assert list(run.steps["rank"].unique()) == [0]


def test_truncated_last_line(runs) -> None:
    rows = [*runs.simple_rank(), '{"kind": "span", "step": 3, "pha']
    run = load_run(runs.write({0: runs.simple_rank(), 1: rows}))
    assert run.skipped == ["rank-00001.jsonl line 10: not valid JSON (truncated?), skipped"]
    assert len(run.steps) == 6


def test_many_bad_lines_make_one_note(runs) -> None:
    rows = ["garbage", *runs.simple_rank(), "more garbage", "{"]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == [
        "rank-00000.jsonl: 3 lines not valid JSON (truncated?), skipped (first at line 1)"
    ]


def test_records_failing_the_schema_are_aggregated_per_reason(runs) -> None:
    bad = {"kind": "comm", "step": 0, "op": "all_reduce", "t0": B, "t1": B + 1}
    rows = [*runs.simple_rank(), bad, bad, "[1, 2]", {"step": 1}]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == [
        "rank-00000.jsonl: 2 records skipped (comm record without group, group_size, bytes)",
        "rank-00000.jsonl: 1 record skipped (not a JSON object)",
        "rank-00000.jsonl: 1 record skipped (no 'kind' field)",
    ]
    assert run.comms.empty


@pytest.mark.parametrize("t1", ["NaN", "Infinity", "null", '"soon"'])
def test_non_finite_or_null_times_are_skipped(runs, t1: str) -> None:
    rows = [
        *runs.simple_rank(),
        f'{{"kind": "span", "step": 1, "phase": "fwd", "t0": 5, "t1": {t1}}}',
    ]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == [
        "rank-00000.jsonl: 1 record skipped (span record with null or non-finite t0/t1)"
    ]
    assert len(run.spans) == 6


def test_nan_loss_is_kept_and_noted_once(runs) -> None:
    rows0 = [runs.step(0, 0, 10, loss=float("nan")), runs.step(1, 10, 20, loss=float("nan"))]
    rows1 = [runs.step(0, 0, 10, loss=float("nan")), runs.step(1, 10, 20, loss=2.0)]
    run = load_run(runs.write({0: rows0, 1: rows1}))
    assert run.skipped == [
        "rank-00000.jsonl, rank-00001.jsonl: loss is NaN in 3 step records (kept)"
    ]
    assert len(run.steps) == 4 and run.steps["loss"].isna().sum() == 3


def test_bad_step_and_reversed_times(runs) -> None:
    rows = [*runs.simple_rank(), runs.span("one", "fwd", 0, 1), runs.span(1, "fwd", 5, 4)]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == [
        "rank-00000.jsonl: 1 record skipped (span record with step 'one', not an integer >= 0)",
        "rank-00000.jsonl: 1 record skipped (span record with t1 before t0)",
    ]


def test_labels_must_be_strings(runs) -> None:
    rows = [*runs.simple_rank(), runs.comm(1, 0, 1, op=["all_reduce"]), runs.span(1, {}, 0, 1)]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == [
        "rank-00000.jsonl: 1 record skipped (comm record whose op is not a string)",
        "rank-00000.jsonl: 1 record skipped (span record whose phase is not a string)",
    ]


def test_repeated_step_records_keep_the_last(runs) -> None:
    rows = [runs.step(0, 0, 10), runs.step(0, 0, 12)]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.skipped == ["rank-00000.jsonl: 1 repeated step records, the last of each kept"]
    assert run.steps["t1"].item() == B + 12_000_000


def test_non_numeric_fields_become_null(runs) -> None:
    rows = [runs.step(0, 0, 10, tokens=[1]), runs.mem(0, params="big")]
    run = load_run(runs.write({0: rows}, runs.manifest(1)))
    assert run.steps["tokens"].isna().all() and run.memory["params"].isna().all()
