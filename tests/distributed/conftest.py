"""Distributed tests: real torchrun-launched gloo processes (2-4 ranks, few steps)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist


def diag_run(run_dir: Path, *args: str, nproc: int = 2, timeout_s: float = 180) -> None:
    """`diag run dp ...` in a subprocess; fails the test with the output if it fails."""
    cmd = [
        sys.executable,
        "-m",
        "diag",
        "run",
        "dp",
        f"--nproc={nproc}",
        "--out",
        str(run_dir),
        *args,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.fixture
def run_dp():
    return diag_run
