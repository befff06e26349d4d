"""The progress line of a long read: files and bytes done, the rate, the time left, on stderr
when it is a terminal (a real pseudo-terminal here), never on a pipe and never in the JSON."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diag.read.progress import MIB, Progress

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "golden-runs" / "dp-profiled" / "traces"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_says_files_bytes_rate_and_time_left() -> None:
    clock, out = Clock(), io.StringIO()
    line = Progress("trace files", 4, 400 * MIB, stream=out, enabled=True, clock=clock)
    clock.now += 1.0
    line.advance(1, 100 * MIB)
    assert out.getvalue() == ""  # a read shorter than AFTER_S stays silent
    clock.now += 3.0  # 4 s in, 200 MiB done: 50 MiB/s, 200 MiB left
    line.advance(1, 100 * MIB)
    shown = out.getvalue()
    assert shown.startswith("\r") and "\n" not in shown
    assert "2/4 trace files" in shown and "200/400 MiB" in shown
    assert "50.0 MiB/s" in shown and "4 s left" in shown
    clock.now += 0.01
    line.advance(1, 100 * MIB)
    assert out.getvalue() == shown  # rewritten at most every EVERY_S
    clock.now += 2.0
    line.advance(1, 100 * MIB)
    last = out.getvalue()[len(shown) :]
    assert last.startswith("\rdiag: read 4/4 trace files") and last.endswith("\n")
    assert "400/400 MiB" in last and "left" not in last


def test_off_when_the_stream_is_not_a_terminal() -> None:
    clock, out = Clock(), io.StringIO()
    line = Progress("rank files", 2, 10, stream=out, clock=clock)  # StringIO: no terminal
    clock.now += 60
    line.advance(1, 5)
    line.advance(1, 5)
    assert out.getvalue() == ""
    assert (line.files, line.bytes) == (2, 10)


def _analyze(folder: Path, on_terminal: bool) -> tuple[str, str]:
    """`diag analyze FOLDER --format json` in a child whose progress shows at once; its
    stderr a pseudo-terminal or a pipe. (stdout, stderr)."""
    code = (
        "import sys, diag.read.progress as p\n"
        "p.AFTER_S = 0.0\n"
        "from diag.cli.main import main\n"
        f"main(['analyze', {str(folder)!r}, '--format', 'json'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIAG_WORKERS": "1"}
    if not on_terminal:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=300)  # fmt: skip
        return done.stdout, done.stderr
    leader, follower = pty.openpty()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=follower, cwd=ROOT, env=env)  # fmt: skip
    os.close(follower)
    seen = b""
    stdout = child.stdout.read() if child.stdout else b""
    child.wait(timeout=300)
    while select.select([leader], [], [], 0.5)[0]:
        try:
            piece = os.read(leader, 65536)
        except OSError:  # the terminal closed with the child
            break
        if not piece:
            break
        seen += piece
    os.close(leader)
    return stdout.decode(), seen.decode(errors="replace")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("progress")
    return Path(shutil.copytree(TRACES, root / "traces", ignore=shutil.ignore_patterns(".diag-*")))


def test_analyze_shows_progress_on_a_terminal_only(folder: Path, tmp_path: Path) -> None:
    stdout, stderr = _analyze(folder, on_terminal=True)
    assert "diag: read 2/2 trace files" in stderr and "MiB/s" in stderr
    assert json.loads(stdout)["findings"] is not None  # the JSON is whole, no line in it
    cold = Path(
        shutil.copytree(folder, tmp_path / "cold", ignore=shutil.ignore_patterns(".diag-*"))
    )
    stdout, stderr = _analyze(cold, on_terminal=False)
    assert "diag: read" not in stderr and "diag: read" not in stdout
    assert json.loads(stdout)["findings"] is not None
