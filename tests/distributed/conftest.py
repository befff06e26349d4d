"""Distributed tests: real torchrun-launched gloo processes (2-4 ranks, few steps)."""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.readme_runs import FailedRuns, hang_run

pytestmark = pytest.mark.dist


FORKRUN = Path(__file__).with_name("forkrun.py")


def diag_run(
    run_dir: Path,
    *args: str,
    nproc: int = 2,
    timeout_s: float = 180,
    trainer: str = "dp",
    real: bool = False,
) -> None:
    """The run directory of `diag run TRAINER --nproc=N --out RUN_DIR ARGS`; fails the test with
    the output if the job fails. `real` (and any run with `--profile-steps`): through `diag
    run` itself (its preflight, torchrun); otherwise the trainer's ranks are forked from one
    launcher that imported torch (tests/distributed/forkrun.py), with the environment `diag
    run` gives them: the same trainer, collectors and run directory, a few seconds of
    start-up less a job."""
    options = [*args, "--out", str(run_dir)]
    command = ["diag", "run", trainer, f"--nproc={nproc}", *options]
    # A run with profiler traces is launched for real: forked ranks inherit the launcher's
    # torch, the profiler's state with it, and a forked loader-stall run's traces read BAL001
    # where its records (and its traces under torchrun) read BAL005 (2 of 4 runs)
    if real or "--profile-steps" in args:
        cmd = [sys.executable, "-m", *command]
    else:
        cmd = [sys.executable, str(FORKRUN), str(nproc), f"reference_runs.{trainer}", *options]
    env = {**os.environ, "DIAG_COMMAND": shlex.join(command), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture
def run_dp():
    return diag_run


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory: pytest.TempPathFactory):
    """`shared_run(trainer, *args, nproc=2, real=False)`: the run directory of `diag run
    TRAINER --nproc=NPROC ARGS` (`diag_run`), made once per session for every test that asks
    for the same run (they only read it; the suite's time is mostly launches)."""
    made: dict[tuple[object, ...], Path] = {}

    def run(trainer: str, *args: str, nproc: int = 2, real: bool = False) -> Path:
        key = (trainer, nproc, real, *args)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{trainer}-shared") / "run"
            diag_run(path, *args, trainer=trainer, nproc=nproc, real=real)
            made[key] = path
        return made[key]

    return run


@pytest.fixture
def run_tp():
    return functools.partial(diag_run, trainer="tp")


@pytest.fixture
def run_ep():
    return functools.partial(diag_run, trainer="ep")


@pytest.fixture(scope="session")
def readme_hang(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README loop with rank 2 hanging in step 3 (tests/distributed/readme_runs.py), once
    per session: what it leaves (test_failure_evidence.py) and what diag names from it
    (test_failures_e2e.py) are read from the same launch."""
    return hang_run(tmp_path_factory.mktemp("readme-hang"))


@pytest.fixture(scope="session")
def readme_failures(tmp_path_factory: pytest.TempPathFactory) -> FailedRuns:
    """`readme_failures.get(modes)`: the README loop crashing, desynchronising, killed or
    healthy, each launched once per session, when a test first asks for it."""
    return FailedRuns(tmp_path_factory.mktemp("readme-failed"))
