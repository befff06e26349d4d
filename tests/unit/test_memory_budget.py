"""Traces parsed as many at once as the memory budget allows (diag/read/memory_budget.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diag.read import memory_budget, parallel
from diag.read.kineto import load_trace_dir
from diag.read.memory_budget import Admission, parse_size

MIB = 2**20


@pytest.mark.parametrize(
    ("text", "size"),
    [("2GiB", 2 * 2**30), ("2G", 2 * 2**30), ("1536MiB", 1536 * MIB), ("512m", 512 * MIB),
     ("1.5 GB", int(1.5 * 2**30)), ("4096", 4096)],
)  # fmt: skip
def test_sizes_are_read_with_their_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2x", "-1G", "0", "GiB", "1e9"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        parse_size(text)


def test_a_parse_starts_only_while_the_parses_in_flight_fit(monkeypatch) -> None:
    monkeypatch.setattr(memory_budget, "rss_bytes", lambda: 100 * MIB)
    gate = Admission(budget=1000 * MIB, peaks=[400 * MIB, 400 * MIB, 600 * MIB, 2000 * MIB])
    assert gate.admits(0, [])
    assert gate.admits(1, [0])  # 100 + 400 + 400 <= 1000
    assert not gate.admits(2, [0, 1])
    assert not gate.admits(2, [0])  # 100 + 400 + 600 > 1000
    assert gate.admits(2, [])
    assert gate.note(workers=2) is None  # two at once: as many as the workers
    assert gate.admits(3, [])  # alone past the budget: the folder must be read
    assert gate.over_budget == [3]
    assert "1 of the traces were estimated to need more alone" in (gate.note(2) or "")


def test_the_budget_comes_from_the_option_the_environment_or_the_machine(monkeypatch) -> None:
    monkeypatch.setenv(memory_budget.MEMORY_ENV, "3GiB")
    assert memory_budget.budget_bytes() == 3 * 2**30
    memory_budget.use_budget(2 * 2**30)
    try:
        assert memory_budget.budget_bytes() == 2 * 2**30
    finally:
        memory_budget.use_budget(None)
    monkeypatch.setenv(memory_budget.MEMORY_ENV, "lots")  # ignored: the machine's share
    available = memory_budget.available_bytes()
    expected = None if available is None else int(available * memory_budget.SHARE_OF_AVAILABLE)
    got = memory_budget.budget_bytes()
    assert (got is None) == (expected is None)
    if got is not None and expected is not None:
        assert abs(got - expected) < 256 * MIB  # the machine's memory moves a little


def _timed(chunk: list[tuple[int, Path]]) -> list[tuple[int, float, float, int]]:
    started = time.monotonic()
    time.sleep(0.3)
    return [(key, started, time.monotonic(), os.getpid()) for key, _ in chunk]


def _most_at_once(spans: list[tuple[int, float, float, int]]) -> int:
    edges = sorted([(a, 1) for _, a, _, _ in spans] + [(b, -1) for _, _, b, _ in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_worker_processes_run_no_more_parses_at_once_than_fit(tmp_path, monkeypatch) -> None:
    files = [(k, tmp_path / f"f{k}") for k in range(4)]
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    free = [row for chunk in parallel.map_chunks(_timed, files, chunk_files=1) for row in chunk]
    assert _most_at_once(free) == 2  # without a budget both workers parse at once
    monkeypatch.setattr(memory_budget, "rss_bytes", lambda: 0)
    gate = Admission(budget=500 * MIB, peaks=[300 * MIB] * 4)
    held = parallel.map_chunks(_timed, files, chunk_files=1, admission=gate)
    rows = [row for chunk in held for row in chunk]
    assert [key for key, *_ in rows] == [0, 1, 2, 3]  # in order, every one
    assert os.getpid() not in {pid for *_, pid in rows}
    assert _most_at_once(rows) == 1
    assert gate.note(workers=2) == (
        "memory budget 0.5 GiB: traces parsed 1 at a time at most, not 2 "
        "(diag analyze --memory-budget)"
    )


@pytest.fixture(scope="module")
def trace_folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("budget") / "traces"
    command = [sys.executable, "-m", "diag", "simulate", "--ranks", "4", "--layout", "dp=2,pp=2",
               "--steps", "3", "--format", "kineto", "--out", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    return out


def test_a_folder_read_within_a_budget_says_so_and_reads_the_same(trace_folder, monkeypatch):
    from diag.read.kineto import PARALLEL_FROM_BYTES  # noqa: F401 (patched below)

    monkeypatch.setattr("diag.read.kineto.PARALLEL_FROM_BYTES", 0)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    monkeypatch.setenv(memory_budget.MEMORY_ENV, "64GiB")
    free = load_trace_dir(trace_folder, use_cache=False)
    assert not [n for n in free.skipped if "memory budget" in n]
    monkeypatch.setenv(memory_budget.MEMORY_ENV, "1MiB")  # less than this process holds
    held = load_trace_dir(trace_folder, use_cache=False)
    notes = [n for n in held.skipped if "memory budget" in n]
    assert notes == [
        "memory budget 0.0 GiB: 4 of the traces were estimated to need more alone, and were "
        "parsed one at a time"
    ]
    assert [n for n in held.skipped if n not in notes] == free.skipped
    assert held.spans.equals(free.spans)
    assert held.comms.equals(free.comms)


def test_the_cli_refuses_a_size_it_cannot_read(trace_folder) -> None:
    command = [sys.executable, "-m", "diag", "analyze", str(trace_folder), "--memory-budget", "2x"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    assert "not a memory size: '2x'" in result.stderr


def test_the_largest_files_start_first_and_come_back_in_order(tmp_path, monkeypatch) -> None:
    """Started largest first, the last parses to finish are the small ones: no worker idles
    long beside the last large one."""
    sizes = [10, 10, 5000, 4000]
    files = [(k, tmp_path / f"f{k}") for k in range(len(sizes))]
    for (_, path), size in zip(files, sizes, strict=True):
        path.write_bytes(b"x" * size)
    monkeypatch.setattr(parallel, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    rows = [row for chunk in parallel.map_chunks(_timed, files, chunk_files=1) for row in chunk]
    assert [key for key, *_ in rows] == [0, 1, 2, 3]
    started = [key for key, *_ in sorted(rows, key=lambda row: row[1])]
    assert set(started[:2]) == {2, 3}
