"""The README's own-loop block, run as written (tests/distributed/readme_job.py extracts it) on
2 gloo ranks: the report must be right, a slow loader must be its rank's, and the issue's bug
(the forward through the inner module) must be caught."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.dist

JOB = Path(__file__).with_name("readme_job.py")


def analyze(run: Path) -> dict[str, Any]:
    """`diag analyze RUN --format json`, as a user would run it."""
    analysis = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(run), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert analysis.returncode == 0, analysis.stderr
    return json.loads(analysis.stdout)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The block as written, rank 1's loader sleeping 40 ms a batch (compute is a few ms), in
    runs/my-job; then the block with the issue's bug in broken/runs/my-job (one launch)."""
    cwd = tmp_path_factory.mktemp("readme")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node=2", str(JOB), "--slow-rank", "1", "--slow-ms", "40",
              "--then-broken"]  # fmt: skip
    result = subprocess.run(launch, cwd=cwd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return cwd


@pytest.fixture(scope="module")
def slow_loader_report(job: Path) -> dict[str, Any]:
    return analyze(job / "runs" / "my-job")


def test_the_readme_block_records_a_dp_job_right(slow_loader_report: dict[str, Any]) -> None:
    report = slow_loader_report
    assert report["run"]["world_size"] == 2
    assert report["run"]["layout"]["dp"] == 2  # inferred from the DDP registration
    assert report["run"]["groups"]["dp"] == [[0, 1]]
    (grad,) = [c for c in report["collectives"] if c["tag"] == "grad"]
    assert grad["group"] == "dp" and grad["ratio"] == pytest.approx(1.0, rel=0.01)
    assert not [f for f in report["findings"] if f["pattern"] is None]  # no pitfall
    memory = report["memory"][0]
    assert memory["params"] > 0 and memory["optimizer"] > 0


def test_a_slow_loader_on_rank_1_is_the_main_finding(slow_loader_report: dict[str, Any]) -> None:
    main = slow_loader_report["findings"][0]
    assert main["ranks"] == [1], main
    assert main["rule"] in {"BAL001", "BAL003", "BAL005"}, main


def test_training_through_the_inner_module_is_a_high_pitfall(job: Path) -> None:
    """The issue's bug: the forward through `net`, not the DDP wrapper: DDP never syncs."""
    report = analyze(job / "broken" / "runs" / "my-job")
    (finding,) = [f for f in report["findings"] if f["rule"] == "PIT004"]
    assert finding["severity"] == "high" and finding["ranks"] == [0, 1]
    evidence = finding["evidence"]
    assert evidence["grad_collectives"] == 0 and evidence["wrapper"] == "ddp"
    # the ranks' weights drift apart from the first optimizer step, which the checksums see
    assert evidence["checksum_step"] == 0 and evidence["checksum_spread"] > 1e-6
    assert report["findings"][0]["rule"] == "PIT004"  # a job that does not learn right first
