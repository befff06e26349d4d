"""Trace folders as frameworks lay them out, and collectives of CPU (gloo) traces: named by
the job's only process group, each counted once, in the step that issued it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import diag


def gloo_trace(rank: int) -> dict[str, Any]:
    """Two 100 us steps; an all-reduce issued at 90 us runs on past the first step's end."""

    def event(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    return {
        "distributedInfo": {
            "backend": "gloo", "rank": rank, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2,
                           "ranks": [0, 1]}],
        },
        "traceEvents": [
            event("ProfilerStep#1", 0, 100, 1, "user_annotation"),
            event("ProfilerStep#2", 100, 100, 1, "user_annotation"),
            event("aten::mm", 10, 70, 1),
            event("aten::mm", 120, 60, 1),
            event("gloo:all_reduce", 90, 20, 2, "user_annotation"),
        ],
    }  # fmt: skip


def write_traces(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for rank in (0, 1):
        (folder / f"rank{rank}_trace.json").write_text(json.dumps(gloo_trace(rank)))
    return folder


def test_a_gloo_collective_is_counted_once_in_the_only_group(tmp_path: Path) -> None:
    run = diag.load_any(write_traces(tmp_path / "traces"))
    comms = run.comms
    assert len(comms) == 2 and sorted(comms["rank"]) == [0, 1]  # once per rank, not per step
    assert set(comms["step"]) == {1} and set(comms["group"]) == {"world"}
    (row,) = diag.analyze_path(tmp_path / "traces")["collectives"]
    assert row["count"] == 1 and row["group"] == "world"


def test_torchtitan_iteration_folders(tmp_path: Path) -> None:
    for window in (5, 10, 15):
        write_traces(tmp_path / "profile_traces" / f"iteration_{window}")
    report = diag.analyze_path(tmp_path / "profile_traces")
    assert report["run"]["run_id"] == "iteration_15"
    (note,) = [n for n in report["skipped"] if "profiled windows" in n]
    assert "the latest of 3" in note and "iteration_10" in note
