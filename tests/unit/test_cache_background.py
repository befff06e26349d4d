"""A large run's tables are written by a forked child while the analysis goes on
(diag/read/background.py, `cache.write(..., in_background=True)`): the entry is whole once the
command has exited or once this process reads it, and a write that fails fails nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from diag.api import analyze_path, load_any
from diag.read import background, cache
from diag.read.sources import run_directory
from tests.conftest import RunWriter
from tests.unit.test_cache import assert_same_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


@pytest.fixture
def large_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A small run that the run-directory source treats as a large one: cached, in the
    background."""
    monkeypatch.setattr(run_directory, "CACHE_MIN_BYTES", 0)
    monkeypatch.setattr(cache, "BACKGROUND_FROM_BYTES", 0)
    runs = RunWriter(tmp_path)
    rows = runs.simple_rank(steps=4)
    return runs.write({0: rows, 1: rows})


@pytest.fixture
def single_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as `diag analyze` is when it writes the cache: no other thread. Earlier
    tests of the suite may leave some running (a server, a cluster's client), and with one
    running `background.start` declines to fork (tested below)."""
    monkeypatch.setattr(background.threading, "active_count", lambda: 1)


def _load_run_fails(*args: object, **kwargs: object) -> None:
    raise AssertionError("parsed again: the tables were not read from the cache")


def test_the_next_load_waits_for_the_tables_and_reads_them(
    large_run: Path, monkeypatch: pytest.MonkeyPatch, single_threaded: None
) -> None:
    first = load_any(large_run)
    assert background.pending() == 1  # written by a child, not by this process
    monkeypatch.setattr(run_directory, "load_run", _load_run_fails)
    again = load_any(large_run)  # waits for the child, then reads what it wrote
    assert background.pending() == 0
    assert not again.cache_notes
    assert_same_run(first, again)


def test_a_failing_background_write_fails_neither_the_analysis_nor_the_next_load(
    large_run: Path, monkeypatch: pytest.MonkeyPatch, single_threaded: None
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("disk on fire")  # not an error the foreground write expects

    monkeypatch.setattr(cache, "_write_ipc", broken)
    report = analyze_path(large_run)
    assert report["summary"]["world_size"] == 2
    assert background.wait() == [1]  # the child said it failed
    assert not (large_run / cache.CACHE_DIR / "run.json").exists()
    monkeypatch.undo()
    assert load_any(large_run).steps.shape == load_any(large_run).steps.shape  # rebuilt


_ANALYZE_SLOW_WRITE = """
import atexit, sys, time
from pathlib import Path
from diag.read import cache
from diag.cli.main import main
from diag.read.sources import run_directory

run_directory.CACHE_MIN_BYTES = 0
cache.BACKGROUND_FROM_BYTES = 0
signed, exiting = cache._write_signed, Path(sys.argv[2])

def after_the_parent_returned(place, name, *args):
    if name == "run":  # the tables' header, last of their entry, after the command returned
        deadline = time.monotonic() + 60
        while not exiting.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)
    signed(place, name, *args)

cache._write_signed = after_the_parent_returned
atexit.register(exiting.touch)  # runs before diag's own hook (the last registered, first run)
main(["analyze", sys.argv[1], "--format", "json"])
"""


def test_the_entry_is_whole_once_the_command_has_exited(
    large_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exiting = large_run.parent / "exiting"
    result = subprocess.run(
        [sys.executable, "-c", _ANALYZE_SLOW_WRITE, str(large_run), str(exiting)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert '"findings"' in result.stdout
    assert (large_run / cache.CACHE_DIR / "run.json").is_file()
    cache.source_digest.cache_clear()  # the key as the command computed it, from today's source
    monkeypatch.setattr(run_directory, "load_run", _load_run_fails)
    assert not load_any(large_run).cache_notes  # every table there, every digest right


def test_a_child_works_on_the_memory_as_it_was_at_the_fork(
    tmp_path: Path, single_threaded: None
) -> None:
    seen, out = ["at the fork"], tmp_path / "seen"
    assert background.start(lambda: bool(out.write_text(" ".join(seen))), "test")
    seen.append("after")  # the parent goes on; the child does not see it
    assert background.wait("test") == [0]
    assert out.read_text() == "at the fork"


def test_no_child_is_forked_while_another_thread_runs() -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not background.start(lambda: True, "test")  # the caller does the work itself
    finally:
        release.set()
        other.join()
    assert background.pending() == 0
