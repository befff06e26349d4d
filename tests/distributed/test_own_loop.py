"""A user's own loop (examples/own_loop.py) instrumented in a few lines, then analysed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[2]


def test_own_loop_example_writes_an_analysable_run(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(ROOT / "examples" / "own_loop.py"),
        "--out",
        str(tmp_path),
        "--steps",
        "5",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]

    analysis = subprocess.run(
        [sys.executable, "-m", "diag", "analyze", str(tmp_path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert analysis.returncode == 0, analysis.stderr
    report = json.loads(analysis.stdout)
    assert report["run"]["trainer"] == "custom" and report["run"]["world_size"] == 2
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["run"]["layout"]["dp"] == 2  # inferred from DDP's registration
    by_tag = {c["tag"]: c for c in report["collectives"]}
    assert by_tag["grad"]["group"] == "dp"
    # DDP's gradient buckets, through the recording hook, match the parameters' bytes ...
    assert by_tag["grad"]["ratio"] == pytest.approx(1.0, rel=0.01)
    # ... and the loop's own loss all-reduce, seen by the tracer: 4 bytes once per step.
    traced = by_tag[None]
    assert traced["op"] == "all_reduce" and traced["bytes_per_step"] == pytest.approx(4)
    assert report["memory"][0]["params"] > 0 and report["memory"][0]["fragmentation"] is None
