"""A killed analysis does not leave its spill behind for good (issue 43, diag/read/scratch.py).

A real analysis of a trace folder large enough to spill (the threshold patched to 0, as
test_kineto_window does), in a child process with two forked workers, each held inside the
spill's write: killed with SIGKILL it leaves its folder, and its workers end with it; the next
analysis removes the folder. Killed with SIGTERM it removes the folder itself. Folders that
are not provably diag's and stale (a live owner's, a link, a file diag does not write, a
folder without its lock too young to judge) stay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import diag.read.kineto as kineto
from benchmarks.processes import children
from diag.metrics.file_reduction import reduce_rank_files
from diag.read import scratch
from diag.read.kineto import SPILL_NAMES, SPILL_PREFIX, load_trace_dir
from tests.unit.simulated_jobs import trace_folder

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="reads processes from /proc (Linux)"
)
HELD = (
    "import sys, time\n"
    "import diag.read.kineto as kineto\n"
    "from diag.metrics.file_reduction import reduce_rank_files\n"
    "from diag.read.kineto import spill\n"
    "kineto.REDUCE_SPANS_FROM_BYTES = 0\n"
    "written = spill.write\n"
    "def held(path, *args):\n"  # in each worker: the trace written, then held there
    "    done = written(path, *args)\n"
    "    time.sleep(600)\n"
    "    return done\n"
    "spill.write = held\n"
    "kineto.load_trace_dir(sys.argv[1], use_cache=False, workers=2,\n"
    "                      breakdown=reduce_rank_files)\n"
)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace_folder(tmp_path_factory, "scratch", steps=4)


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of the test's own, for this process and its children."""
    found = tmp_path / "tmp"
    found.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(found))
    monkeypatch.setenv("TMPDIR", str(found))
    yield found


def _running(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"  # a zombie has let go of its files and locks


def _analysis_inside_its_spill(traces: Path, temp_dir: Path) -> tuple[subprocess.Popen, Path]:
    """A child analysing `traces`, once both its workers have written a trace to its spill
    folder (and are held there); the folder."""
    child = subprocess.Popen([sys.executable, "-c", HELD, str(traces)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        folders = list(temp_dir.glob(f"{SPILL_PREFIX}{child.pid}-*"))
        if folders and len(list(folders[0].glob("*.npz"))) >= 2:
            return child, folders[0]
        assert child.poll() is None, "the analysis ended before spilling"
        time.sleep(0.2)
    child.kill()
    child.wait()
    raise AssertionError("no spill within 240 s")


def _gone(pids: list[int], within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(_running, pids))


def test_a_sigkilled_analysis_spill_is_removed_by_the_next(
    traces: Path, temp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child, folder = _analysis_inside_its_spill(traces, temp_dir)
    workers = children(child.pid)
    assert len(workers) >= 2, workers
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    assert _gone(workers), "the workers outlived their analysis"
    assert folder.is_dir() and list(folder.glob("*.npz"))  # what a kill leaves
    # the folder says whose it was: the PID and its start time
    assert folder.name.startswith(f"{SPILL_PREFIX}{child.pid}-")
    monkeypatch.setattr(kineto, "REDUCE_SPANS_FROM_BYTES", 0)
    run = load_trace_dir(traces, use_cache=False, workers=1, breakdown=reduce_rank_files)
    assert run.rank_steps is not None  # this analysis spilled too, and removed its own
    assert not folder.exists()
    assert not list(temp_dir.iterdir())


def test_a_sigterm_removes_the_spill_at_once(traces: Path, temp_dir: Path) -> None:
    child, folder = _analysis_inside_its_spill(traces, temp_dir)
    workers = children(child.pid)
    started = time.monotonic()
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM  # not after the workers' 600 s
    assert time.monotonic() - started < 60
    assert _gone(workers)
    assert not folder.exists()
    assert not list(temp_dir.iterdir())


def _stale(temp_dir: Path, pid: int, *, lock: bool = True, files: tuple[str, ...] = ()) -> Path:
    """A folder as a killed analysis leaves it (its lock held by no process)."""
    folder = temp_dir / f"{SPILL_PREFIX}{pid}-{scratch.start_time(pid)}-ab12cd_9"
    folder.mkdir(mode=0o700)
    for name in ((scratch.LOCK_NAME,) if lock else ()) + files:
        (folder / name).write_bytes(b"x")
    return folder


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_folders_provably_diags_and_stale_are_removed(temp_dir: Path) -> None:
    with scratch.owned_folder(SPILL_PREFIX, SPILL_NAMES) as mine:
        (mine / "0.npz").write_bytes(b"x")
        dead = _dead_pid()
        stale = _stale(temp_dir, dead, files=("0.npz", "12.npz"))
        odd = _stale(temp_dir, dead + 1, files=("0.npz", "notes.txt"))  # not a file diag writes
        target = temp_dir / "elsewhere"
        target.mkdir()
        (target / "0.npz").write_bytes(b"x")
        link = temp_dir / f"{SPILL_PREFIX}{dead}-0-linked"
        link.symlink_to(target)
        unlocked = _stale(temp_dir, dead + 2, lock=False, files=("3.npz",))  # too young to judge
        old_unlocked = _stale(temp_dir, dead + 3, lock=False, files=("3.npz",))
        long_ago = time.time() - 2 * scratch.UNLOCKED_GRACE_S
        os.utime(old_unlocked, (long_ago, long_ago))
        other_kind = _stale(temp_dir, dead + 4, files=("0.npz",))
        other_kind = other_kind.rename(temp_dir / f"diag-records-{dead}-0-ab12cd_9")
        removed = scratch.remove_stale(SPILL_PREFIX, SPILL_NAMES)
        assert sorted(removed) == sorted([stale.name, old_unlocked.name])
        assert mine.is_dir()  # its owner lives (this process holds its lock)
    assert not mine.exists()
    assert odd.is_dir() and (odd / "notes.txt").exists()
    assert link.is_symlink() and (target / "0.npz").exists()
    assert unlocked.is_dir()
    assert other_kind.is_dir()  # another kind's folder: not these names


def test_a_folder_locked_by_a_live_process_stays_even_where_its_pid_is_gone(
    temp_dir: Path,
) -> None:
    """The lock, not the PID, says the owner lives (PID namespaces sharing a /tmp)."""
    import fcntl

    folder = _stale(temp_dir, _dead_pid(), files=("0.npz",))
    handle = os.open(folder / scratch.LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        assert scratch.remove_stale(SPILL_PREFIX, SPILL_NAMES) == []
        assert folder.is_dir()
    finally:
        os.close(handle)
    assert scratch.remove_stale(SPILL_PREFIX, SPILL_NAMES) == [folder.name]


def test_an_analysis_that_does_not_spill_removes_them_too(traces: Path, temp_dir: Path) -> None:
    stale = _stale(temp_dir, _dead_pid(), files=("0.npz",))
    run = load_trace_dir(traces, use_cache=False, workers=1)  # small: nothing spilled
    assert run.rank_steps is None
    assert not stale.exists()


def test_a_process_forked_while_a_folder_is_owned_ends_on_sigterm_by_default(
    temp_dir: Path,
) -> None:
    """The owner unwinds on SIGTERM (its folder removed); a child forked meanwhile has the
    default action from its start, so SIGTERM ends it even where it never runs Python again
    (stuck in C: a pool's terminate() then waited for ever)."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a command starts
    try:
        with scratch.owned_folder("diag-fork-test-", r"lock"):
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            child = os.fork()
            if child == 0:  # the child: exit 0 where SIGTERM's action is the default one
                os._exit(0 if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 1)
            _, status = os.waitpid(child, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the owner's, still
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
