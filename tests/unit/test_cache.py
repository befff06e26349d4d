"""The cache beside the data holds data only and trusts nothing it did not sign: a pickle, a
forged entry, someone else's entry or a tampered table is ignored with a note and rebuilt; a
changed diag source invalidates what the old code computed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from diag.api import analyze_path, load_any
from diag.metrics import reduce_rank_files
from diag.read import cache
from diag.read.kineto import load_trace_dir
from diag.read.load import RunData, load_run
from diag.read.sources import LoadOptions, run_directory

ROOT = Path(__file__).resolve().parents[2]
SOURCE_TREES = ("diag", "dashboard", "collectors")
CODE_LOADERS = ("pickle", "marshal", "shelve", "dill", "joblib", "cloudpickle")


class _Payload:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _x(name: str, cat: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": args}  # fmt: skip


def _trace_folder(folder: Path, ranks: int = 2) -> Path:
    """A Kineto trace folder: each rank one ProfilerStep with an operator and an all-reduce."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        events = [
            _x("ProfilerStep#1", "user_annotation", 0, 100),
            _x("aten::mm", "cpu_op", 5, 40),
            _x("record_param_comms", "cpu_op", 50, 30 + 10 * rank, **{
                "Collective name": "allreduce", "In msg nelems": 100, "Out msg nelems": 100,
                "dtype": "Float", "Group size": ranks}),
        ]  # fmt: skip
        info = {"backend": "nccl", "rank": rank, "world_size": ranks}
        data = {"schemaVersion": 1, "traceEvents": events, "distributedInfo": info}
        (folder / f"rank{rank}.pt.trace.json").write_text(json.dumps(data))
    return folder


def _hostile_pickles(folder: Path, marker: Path) -> None:
    """What today's diag would have unpickled, and pickles under the new entries' names."""
    entries = folder / cache.CACHE_DIR
    entries.mkdir(parents=True, exist_ok=True)
    payload = pickle.dumps(("any key", _Payload(marker)))
    for name in ("kineto.pickle", "run.pickle", "kineto.json", "report.json", "run.json",
                 "kineto.spans.arrow"):  # fmt: skip
        (entries / name).write_bytes(payload)


def assert_same_run(a: RunData, b: RunData) -> None:
    for table in ("steps", "spans", "comms", "memory", "experts", "events", "rank_steps"):
        left, right = getattr(a, table), getattr(b, table)
        if left is None or right is None:
            assert left is None and right is None, table
            continue
        pd.testing.assert_frame_equal(left, right, check_exact=True, obj=table)
    assert (a.manifest, a.span_steps, a.starts_at_warmup) == (
        b.manifest, b.span_steps, b.starts_at_warmup)  # fmt: skip


# --- no code runs from input ----------------------------------------------------------------------


def test_no_module_of_diag_imports_a_code_loading_format() -> None:
    offenders = []
    for tree in SOURCE_TREES:
        for source in (ROOT / tree).rglob("*.py"):
            for number, line in enumerate(source.read_text().splitlines(), 1):
                words = line.strip().split()
                if words[:1] in (["import"], ["from"]) and any(
                    words[1].split(".")[0] == loader for loader in CODE_LOADERS
                ):
                    offenders.append(f"{source.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders


def test_hostile_pickle_beside_a_trace_folder_does_not_run(tmp_path: Path) -> None:
    folder, marker = _trace_folder(tmp_path / "traces"), tmp_path / "pwned"
    _hostile_pickles(folder, marker)
    result = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(folder), "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    report = json.loads(result.stdout)
    assert any("not a diag cache entry" in note for note in report["cache_notes"])
    # the entries were rebuilt as signed data: the next analysis uses them, without a note
    again = analyze_path(folder)
    assert not any("cache" in note for note in again["skipped"])
    assert not marker.exists()


def test_hostile_pickle_beside_a_run_does_not_run_in_the_dashboard(tmp_path: Path) -> None:
    from dashboard.data import load_runs

    folder, marker = _trace_folder(tmp_path / "traces"), tmp_path / "pwned"
    _hostile_pickles(folder, marker)
    (loaded,) = load_runs([folder])
    assert not marker.exists()
    assert loaded.report["summary"]["world_size"] == 2


# --- signed entries -------------------------------------------------------------------------------


def test_tables_read_back_equal(tmp_path: Path) -> None:
    folder = _trace_folder(tmp_path / "traces")
    parsed = load_trace_dir(folder, use_cache=False)
    assert cache.write(folder, "t", "key", parsed) is not None
    assert_same_run(parsed, cache.read(folder, "t", "key").value)
    assert cache.read(folder, "t", "other key").note is not None


def test_forged_report_is_ignored_and_said(tmp_path: Path) -> None:
    folder = _trace_folder(tmp_path / "traces")
    honest = analyze_path(folder)
    entry = folder / cache.CACHE_DIR / "report.json"
    header, _, body = entry.read_bytes().partition(b"\n")
    forged = json.loads(body)
    forged["report"]["findings"] = [{"rule": "FAKE", "severity": "high"}]
    entry.write_bytes(header + b"\n" + json.dumps(forged).encode())  # the old signature
    again = analyze_path(folder)
    assert again["findings"] == honest["findings"]
    assert any("signature does not verify" in note for note in again["cache_notes"])


def test_an_entry_written_by_another_user_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _trace_folder(tmp_path / "traces")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "someone-else"))
    load_trace_dir(folder)  # signed under someone else's secret
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "me"))
    mine = load_trace_dir(folder)
    assert any("not written by this user's diag" in note for note in mine.cache_notes)
    assert not any("cache" in note for note in load_trace_dir(folder).cache_notes)  # rebuilt


def test_a_tampered_table_is_not_read(tmp_path: Path) -> None:
    folder = _trace_folder(tmp_path / "traces")
    first = load_trace_dir(folder)
    table = folder / cache.CACHE_DIR / "kineto.spans.arrow"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    again = load_trace_dir(folder)
    assert any("digest" in note for note in again.cache_notes)
    assert_same_run(first, again)


def test_a_secret_others_can_read_disables_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    folder = _trace_folder(tmp_path / "traces")
    load_trace_dir(folder)
    (home / "diag" / cache.SECRET_FILE).chmod(0o644)
    shutil.rmtree(folder / cache.CACHE_DIR)
    load_trace_dir(folder)
    assert not (folder / cache.CACHE_DIR).exists()  # nothing signed with a secret others read


# --- keys cover the code --------------------------------------------------------------------------


def test_keys_cover_every_module_the_tables_come_from() -> None:
    modules = run_directory.loader_modules(LoadOptions(breakdown=reduce_rank_files))
    run = {str(p.relative_to(ROOT)) for p in cache.source_closure(modules)}
    assert {"diag/read/load.py", "diag/rankfile/records.py", "diag/contract/schema.py",
            "diag/numeric/intervals.py", "diag/metrics/time_breakdown.py"} <= run  # fmt: skip
    kineto = {str(p.relative_to(ROOT)) for p in cache.source_closure(["diag.read.kineto"])}
    assert {"diag/read/kineto/convert.py", "diag/read/kineto/device.py",
            "diag/read/load.py", "diag/read/kineto/event_scan.c"} <= kineto  # fmt: skip


_LOAD_TWICE = """
import sys
from diag.api import load_any
run = load_any(sys.argv[1])
print(any("stale" in note for note in run.cache_notes))
"""


def test_a_changed_diag_source_invalidates_the_cached_tables(tmp_path: Path) -> None:
    """The same run loaded by a copy of diag, before and after one of the modules that compute
    the tables (intervals.py) changes: the second load does not use the first one's tables."""
    code = tmp_path / "code"
    shutil.copytree(ROOT / "diag", code / "diag", ignore=shutil.ignore_patterns("__pycache__"))
    folder = _trace_folder(tmp_path / "traces")

    def load() -> str:
        env = {**os.environ, "PYTHONPATH": str(code)}
        result = subprocess.run(
            [sys.executable, "-c", _LOAD_TWICE, str(folder)], capture_output=True, text=True,
            env=env, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert load() == "False"  # written
    assert load() == "False"  # read back, unchanged code
    with (code / "diag" / "numeric" / "intervals.py").open("a") as fh:
        fh.write("\n# a new version of the interval arithmetic\n")
    assert load() == "True"


def test_a_large_run_directory_is_served_from_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import RunWriter

    runs = RunWriter(tmp_path)
    rows = runs.simple_rank(steps=4)
    folder = runs.write({0: rows, 1: rows})
    monkeypatch.setattr(run_directory, "CACHE_MIN_BYTES", 0)
    first = load_any(folder)
    assert (folder / cache.CACHE_DIR / "run.json").is_file()
    assert_same_run(first, load_any(folder))
    assert_same_run(load_run(folder), load_any(folder))
