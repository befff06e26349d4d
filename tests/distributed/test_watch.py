"""`diag watch` beside a real 4-rank torchrun job (gloo) that gets a straggler midway
(`straggler:rank=2,ms=80,from=FROM_STEP`): the straggler is named while the job still runs,
within a few seconds of the step where it begins, never before it, and the watch ends when the
manifest says the run did."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diag import load_any

pytestmark = pytest.mark.dist

STEPS = 40
FROM_STEP = 15
DETECTED_WITHIN_S = 6.0
"""From the straggler's first step to the line naming it: the window (6 steps) must hold a
few slow steps, and each analysis takes about a second on 2 busy cores."""


def _lines(stream: object, into: list[tuple[float, str]]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.append((time.time(), line.rstrip("\n")))


def test_watch_names_a_straggler_that_appears_midway(tmp_path: Path) -> None:
    run = tmp_path / "dp4-late-straggler"
    job = subprocess.Popen(
        [sys.executable, "-m", "diag", "run", "dp", "--nproc=4", "--steps", str(STEPS),
         "--out", str(run), "--inject", f"straggler:rank=2,ms=80,from={FROM_STEP}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    watcher = subprocess.Popen(
        [sys.executable, "-u", "-m", "diag", "watch", str(run), "--interval", "0.5",
         "--window", "6", "--wait", "180"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: list[tuple[float, str]] = []
    reader = threading.Thread(target=_lines, args=(watcher.stdout, seen), daemon=True)
    reader.start()
    try:
        job_output, _ = job.communicate(timeout=240)
        assert job.returncode == 0, job_output[-3000:]
        assert watcher.wait(timeout=60) == 0, seen
    finally:
        for process in (job, watcher):
            if process.poll() is None:
                process.kill()
    reader.join(timeout=10)
    assert seen[-1][1] == f"diag watch: run complete after step {STEPS - 1}", seen

    loaded = load_any(run)
    starts_s = loaded.steps.groupby("step")["t0"].min() / 1e9  # the collectors' wall clock
    ends_s = loaded.steps.groupby("step")["t1"].max() / 1e9
    named = [(at, line) for at, line in seen if " BAL001 " in line and "rank 2 " in line]
    assert named, seen
    at, line = named[0]
    step = int(line.split()[1])
    print(f"BAL001 rank 2 named {at - starts_s[FROM_STEP]:.1f} s after step {FROM_STEP} began")
    assert step >= FROM_STEP, line  # not before the straggler exists
    assert at - starts_s[FROM_STEP] < DETECTED_WITHIN_S, (at - starts_s[FROM_STEP], line)
    assert at < ends_s[STEPS - 1], "named only after the job ended"
    early = [line for _, line in seen if " BAL001 " in line and int(line.split()[1]) < FROM_STEP]
    assert early == []
