"""The live views beside one real 4-rank dp job (gloo; its ranks forked from a launcher that
imported torch, tests/distributed/forkrun.py) that gets a straggler midway
(`straggler:rank=2,ms=80,from=FROM_STEP`):
- `diag watch RUN` names the straggler while the job runs, within a few seconds of the step where
  it begins and never before it, and ends when the manifest says the run ended;
- `diag dashboard RUN --live` in headless Chromium: the Overview follows the run without a reload
  (its step count grows) and names the straggler.
One job for both: a job's start is most of the cost."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from dashboard.app import create_app
from diag import RunTail, load_any
from tests.browser.conftest import _need_browser, _serving
from tests.distributed.conftest import FORKRUN

pytestmark = pytest.mark.browser

STEPS = 60
FROM_STEP = 15
DETECTED_WITHIN_S = 10.0
"""From the straggler's first step to the watch's line naming it: the window (6 steps) must
hold a few slow steps, and an analysis takes 1-3 s here, where the job's 4 ranks, the live
dashboard's analyses and Chromium share 2 cores (6.2-7.5 s measured so)."""
OVERVIEW_JS = """
return {
  marker: window.__diagNotReloaded === true,
  navigations: performance.getEntriesByType('navigation').length,
  steps: Array.from(document.querySelectorAll('#page .fact'))
    .filter(f => f.querySelector('.label').textContent === 'mean step')
    .map(f => f.querySelector('.value').textContent)[0] || null,
  findings: Array.from(document.querySelectorAll('#page .finding'), (f) => ({
    what: f.querySelector('.what').textContent,
    who: (f.querySelector('.who') || {}).textContent || '',
    rule: (f.querySelector('.catalogue') || {}).textContent || '',
  })),
};
"""


def _names_the_straggler(card: dict[str, str]) -> bool:
    return card["rule"].startswith("BAL001 ") and card["who"] == "rank 2"


def _analysed_steps(mean_step: str) -> int:
    """N of the Overview's `mean step` fact: `106.8 ms over steps 1-7 (N steps)`."""
    return int(mean_step.rsplit("(", 1)[1].split()[0])


def _lines(stream: Iterable[str], into: list[tuple[float, str]]) -> None:
    for line in stream:
        into.append((time.time(), line.rstrip("\n")))


def _started(run: Path, job: subprocess.Popen[str], timeout_s: float = 180) -> None:
    """Until every rank has finished its first two steps (the dashboard needs steps to show)."""
    tail = RunTail(run)
    deadline = time.monotonic() + timeout_s
    while True:
        assert job.poll() is None, "the job ended before the dashboard started"
        assert time.monotonic() < deadline, "the job did not start"
        manifest = tail.manifest()
        if manifest is not None:
            tail.poll(manifest)
            if (tail.finished_step(manifest.world_size) or 0) >= 1:
                return
        time.sleep(0.1)


@pytest.fixture(scope="module")
def live(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job, `diag watch` beside it (its lines with the time each arrived), and what the
    live dashboard's Overview showed, polled until it named the straggler."""
    _need_browser()
    run = tmp_path_factory.mktemp("live") / "dp4-late-straggler"
    job = subprocess.Popen(  # `diag run dp --nproc=4 ...`, its ranks forked (forkrun.py)
        [sys.executable, str(FORKRUN), "4", "reference_runs.dp", "--steps", str(STEPS),
         "--out", str(run), "--inject", f"straggler:rank=2,ms=80,from={FROM_STEP}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    watcher = subprocess.Popen(
        [sys.executable, "-u", "-m", "diag", "watch", str(run), "--interval", "0.5",
         "--window", "6", "--wait", "180"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=_lines, args=(watcher.stdout, lines), daemon=True)
    reader.start()
    seen: list[dict[str, Any]] = []
    try:
        _started(run, job)
        with _serving(create_app([run], live_interval_s=0.5)) as url:
            browser.get(url + "/")
            browser.execute_script("window.__diagNotReloaded = true;")
            seen.append(browser.execute_script(OVERVIEW_JS))
            deadline = time.monotonic() + 120
            while not any(_names_the_straggler(f) for f in seen[-1]["findings"]):
                assert time.monotonic() < deadline, seen[-1]
                time.sleep(0.25)
                seen.append(browser.execute_script(OVERVIEW_JS))
        output, _ = job.communicate(timeout=180)
        assert job.returncode == 0, output[-3000:]
        watched = watcher.wait(timeout=60)
    finally:
        for process in (job, watcher):
            if process.poll() is None:
                process.kill()
    reader.join(timeout=10)
    return {"run": run, "watch": lines, "watch_rc": watched, "overview": seen}


def test_watch_names_the_straggler_while_the_job_runs(live: dict[str, Any]) -> None:
    lines = live["watch"]
    assert live["watch_rc"] == 0, lines
    assert lines[-1][1] == f"diag watch: run complete after step {STEPS - 1}", lines
    loaded = load_any(live["run"])
    starts_s = loaded.steps.groupby("step")["t0"].min() / 1e9  # the collectors' wall clock
    ends_s = loaded.steps.groupby("step")["t1"].max() / 1e9
    named = [(at, line) for at, line in lines if "[BAL001," in line and "rank 2 " in line]
    assert named, lines
    at, line = named[0]
    late_s = at - starts_s[FROM_STEP]
    print(f"diag watch named BAL001 rank 2 {late_s:.1f} s after step {FROM_STEP} began")
    assert int(line.split()[1]) >= FROM_STEP, line  # not before the straggler exists
    assert late_s < DETECTED_WITHIN_S, (late_s, line)
    assert at < ends_s[STEPS - 1], "named only after the job ended"
    early = [line for _, line in lines if "[BAL001," in line and int(line.split()[1]) < FROM_STEP]
    assert early == []


def test_the_live_overview_follows_the_run_without_a_reload(live: dict[str, Any]) -> None:
    seen = live["overview"]
    last = seen[-1]
    assert last["marker"] and last["navigations"] == 1  # redrawn in place, never reloaded
    counts = [_analysed_steps(s["steps"]) for s in seen if s["steps"]]
    assert counts[-1] > counts[0], (counts, seen[0])  # the Overview followed the run
    straggler = next(f for f in last["findings"] if _names_the_straggler(f))
    # the injection sleeps (no CPU used): the finding says so rather than "computes"
    assert "rank 2 sleeps or blocks outside compute" in straggler["what"]
