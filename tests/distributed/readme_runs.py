"""The README's own loop (tests/distributed/readme_job.py) on RANKS gloo ranks under torchrun,
rank RANK failing in its forward of step STEP: the launches that tests/distributed/
test_failure_evidence.py (what the job leaves) and test_failures_e2e.py (what diag names) share,
once per session (tests/distributed/conftest.py: `readme_hang`, `readme_failures`). The suite's
time is mostly these launches: each starts torchrun and imports torch in every rank."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from diag.rankfile.convert import rank_file, rank_records

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("readme_job.py")
RANKS, STEPS, RANK, STEP = 3, 5, 2, 3
PG_TIMEOUT_S = 10
STALL_FLOOR_S, HEARTBEAT_S = 1.5, 0.5
ENV = {
    "DIAG_STALL_FLOOR_S": str(STALL_FLOOR_S),
    "DIAG_HEARTBEAT_S": str(HEARTBEAT_S),
    "DIAG_PG_TIMEOUT_S": str(PG_TIMEOUT_S),
}
"""A stall after 1.5 s of silence (the steps take milliseconds), well inside the timeout (which
also bounds the start: the ranks meet at init within it, so it stays long on loaded cores)."""
FAILURES = ("crash", "desync", "kill")


FORKRUN = Path(__file__).with_name("forkrun.py")


def launch(cwd: Path, failure: str | None, torchrun: bool = True) -> subprocess.Popen[str]:
    """The loop on RANKS ranks in `cwd`, under torchrun or (`torchrun=False`) forked from one
    launcher that imported torch (tests/distributed/forkrun.py: torchrun's environment, and
    its SIGTERM to the others when a rank fails)."""
    if torchrun:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={RANKS}", str(JOB)]  # fmt: skip
    else:
        command = [sys.executable, str(FORKRUN), str(RANKS), "tests.distributed.readme_job"]
    command += ["--steps", str(STEPS), "--pg-timeout-s", str(PG_TIMEOUT_S)]
    if failure is not None:
        command += ["--fail", failure, "--fail-rank", str(RANK), "--fail-step", str(STEP)]
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(command, cwd=cwd, env={**os.environ, **ENV}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def finish(job: subprocess.Popen[str]) -> str:
    try:
        output, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
    return output


def records(run: Path, rank: int) -> list[dict[str, Any]]:
    """The rank's records so far (a file still being written has no end-of-stream yet)."""
    path = rank_file(run, rank)
    return [] if path is None else rank_records(path, [])


def events(recs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["kind"] == "event" and r.get("name") == name]


def _watch(run: Path) -> tuple[subprocess.Popen[str], list[tuple[int, str]]]:
    """`diag watch RUN` started now, its lines with the wall time each arrived (ns)."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "diag", "watch", str(run), "--interval", "0.5", "--wait", "120"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    lines: list[tuple[int, str]] = []

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            lines.append((time.time_ns(), line.rstrip()))

    threading.Thread(target=read, daemon=True).start()
    return watch, lines


def hang_run(cwd: Path) -> dict[str, Any]:
    """The hanging loop alone on the machine (`diag watch`'s latency is measured), `diag
    watch` beside it; every rank's records read while it hangs (once each has a stall), then
    the run directory, the output and the exit codes once torchrun has ended the job."""
    run = cwd / "runs" / "my-job"
    job = launch(cwd, "hang")
    watch, lines = _watch(run)
    try:
        during: list[list[dict[str, Any]]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            during = [records(run, rank) for rank in range(RANKS)]
            if all(events(recs, "stall") for recs in during):
                break
            time.sleep(0.5)
        output = finish(job)
        watch_rc = watch.wait(timeout=120)
    finally:
        for process in (job, watch):
            if process.poll() is None:
                process.kill()
    time.sleep(0.2)  # the reader's last line
    return {"run": run, "during": during, "output": output, "returncode": job.returncode,
            "watch_rc": watch_rc, "watch_lines": lines}  # fmt: skip


def launch_pp_hang(cwd: Path) -> subprocess.Popen[str]:
    """`diag run pp --nproc 4 --inject hang:rank=RANK,step=STEP` (a reference trainer other
    than dp hanging), its ranks forked (forkrun.py); the run directory is CWD/run."""
    command = [sys.executable, str(FORKRUN), "4", "reference_runs.pp", "--out", str(cwd / "run"),
               "--steps", str(STEPS), "--inject", f"hang:rank={RANK},step={STEP}"]  # fmt: skip
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip


class FailedRuns:
    """The loop failing each way (and healthy), and the pp trainer hanging (`pp-hang`): all
    launched when a test first asks for one of them, each from a launcher that imported torch
    (forkrun.py), two at a time. Not more: a desync or a kill is named right only if the other
    ranks have reached the collective when the launcher ends them, and a rank kept off a core
    by many neighbours may still be a step behind (5 jobs at once: a desync named `ranks 0,2
    never joined`). The README loop's hang, whose timing is measured and whose rank torchrun's
    own SIGTERM ends, runs alone under torchrun (`hang_run`)."""

    WAVES = (("crash", "desync"), ("kill", "healthy"), ("pp-hang",))

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[str, dict[str, Any]] = {}

    def get(self, modes: Iterable[str]) -> dict[str, dict[str, Any]]:
        wanted = list(modes)
        if any(m not in self.runs for m in wanted):
            for wave in self.WAVES:
                jobs = [(m, self._launch(m)) for m in wave if m not in self.runs]
                for name, job in jobs:
                    output = finish(job)
                    run = self.root / name / ("run" if name == "pp-hang" else "runs/my-job")
                    assert run.is_dir(), f"{name}: no run directory\n{output[-3000:]}"
                    self.runs[name] = {"run": run, "output": output,
                                       "returncode": job.returncode}  # fmt: skip
        return {m: self.runs[m] for m in wanted}

    def _launch(self, mode: str) -> subprocess.Popen[str]:
        if mode == "pp-hang":
            return launch_pp_hang(self.root / mode)
        return launch(self.root / mode, None if mode == "healthy" else mode, torchrun=False)
