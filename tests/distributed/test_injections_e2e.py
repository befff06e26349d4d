"""The `loader-stall` and `jitter` injections of the reference trainers, diagnosed end to end:
2-rank dp runs of 6 (loader-stall, 100 ms) and 8 (jitter) steps (gloo).

A stall outside the recorded step reads as host time on the stalled rank (BAL005, pattern 3),
not as a slower rank's compute (BAL001, pattern 1); per-rank, per-step jitter reads as random
imbalance (BAL004) that names no rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.api import analyze_path

pytestmark = pytest.mark.dist


LOADER_STALL = ["--steps", "6", "--inject", "loader-stall:rank=1,ms=100", "--profile-steps", "2:6"]
"""Shared with test_traces_agree.py, which reads its profiler traces (the profiler slows both
ranks alike)."""


def test_loader_stall_is_host_time_on_its_rank(shared_run) -> None:
    findings = analyze_path(shared_run("dp", *LOADER_STALL))["findings"]
    main = findings[0]
    assert (main["rule"], main["ranks"]) == ("BAL005", [1]), findings
    assert main["pattern"] != 1


def test_jitter_is_random_imbalance_naming_no_rank(tmp_path: Path, run_dp) -> None:
    # 8 steps: over fewer, each rank's median draw differs enough to read as a persistent
    # excess; 100 ms: balancing two ranks saves half their gap (|a - b| / 2, 17 ms on average),
    # well above the DP transfers even when gloo is slow on a loaded machine
    run_dp(tmp_path, "--steps", "8", "--inject", "jitter:ms=100", nproc=2)
    findings = analyze_path(tmp_path)["findings"]
    main = findings[0]
    assert (main["rule"], main["ranks"]) == ("BAL004", []), findings
