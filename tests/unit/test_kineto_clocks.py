"""A trace folder whose hosts' clocks differ reads as the same job on one clock: the offsets
are read from the collectives' ends (members of an all-reduce finish together) and removed,
with a note (diag/read/kineto/clocks.py). Before, a second host's clock 20 ms ahead made the
straggler of this job cost 9.6 ms instead of 29.4 and no longer come first."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from diag.api import analyze_path

SHIFT_MS = 20
SECOND_HOST = (2, 3)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dp=4 job on two hosts of two GPUs, rank 1 a straggler; and the same traces with the
    second host's clock SHIFT_MS ahead (every time its profiler wrote moved by it)."""
    root = tmp_path_factory.mktemp("clocks")
    base = root / "one-clock"
    args = ["--layout", "dp=4", "--gpus-per-node", "2", "--steps", "5", "--format", "kineto",
            "--inject", "straggler:rank=1,ms=30", "--out", str(base)]  # fmt: skip
    subprocess.run([sys.executable, "-m", "diag", "simulate", *args], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    shifted = root / "two-clocks"
    shutil.copytree(base, shifted)
    for path in shifted.glob("*.json"):
        trace = json.loads(path.read_text())
        if trace.get("distributedInfo", {}).get("rank") in SECOND_HOST:
            for event in trace["traceEvents"]:
                if "ts" in event:
                    event["ts"] += SHIFT_MS * 1000
            path.write_text(json.dumps(trace))
    return {"one": base, "two": shifted}


def _main(report: dict) -> dict:
    return report["findings"][0]


def test_a_second_hosts_clock_is_aligned_and_the_straggler_keeps_its_cost(folders) -> None:
    one, two = analyze_path(folders["one"]), analyze_path(folders["two"])
    assert not any("clocks aligned" in note for note in one["skipped"])
    (note,) = [note for note in two["skipped"] if "clocks aligned" in note]
    assert f"rank 2 -{SHIFT_MS} ms, rank 3 -{SHIFT_MS} ms" in note, note
    assert "rank 0" not in note and "rank 1 " not in note  # the clock most ranks keep
    first, aligned = _main(one), _main(two)
    assert (aligned["rule"], aligned["ranks"]) == (first["rule"], first["ranks"]) == ("BAL001", [1])
    assert aligned["cost_s"] == pytest.approx(first["cost_s"], rel=0.05)


def test_offsets_below_the_ends_noise_are_left_alone(folders, tmp_path: Path) -> None:
    """A few microseconds apart (one host, or clocks synchronised well) is not a clock."""
    near = tmp_path / "near"
    shutil.copytree(folders["one"], near)
    for path in near.glob("*.json"):
        trace = json.loads(path.read_text())
        if trace.get("distributedInfo", {}).get("rank") in SECOND_HOST:
            for event in trace["traceEvents"]:
                if "ts" in event:
                    event["ts"] += 10  # 10 us
            path.write_text(json.dumps(trace))
    report = analyze_path(near)
    assert not any("clocks aligned" in note for note in report["skipped"])
