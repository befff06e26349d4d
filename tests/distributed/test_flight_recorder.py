"""Real gloo jobs that fail (tests/distributed/fr_job.py: rank 1 hangs before a collective, or
broadcasts where the others all-reduce) and one that does not, each with its rank files and
PyTorch's own Flight Recorder dumps (`_dump_fr_trace_json`, torch's format as it is): the
failure is named from the run directory alone, from the dumps alone, and from both; the
healthy job raises no failure finding; the pickled dumps torch writes read through the
hand-written reader (diag/read/safe_pickle.py) exactly as `pickle.loads` reads them, and like
their JSON."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diag.api import analyze_path
from diag.contract.limits import MAX_FR_DEPTH, MAX_FR_DUMP_BYTES, MAX_FR_OBJECTS
from diag.read.flight_recorder import FR_DIR, read_dump
from diag.read.safe_pickle import load_plain

pytestmark = pytest.mark.dist

JOB = Path(__file__).with_name("fr_job.py")
MODES = ("hang", "desync", "healthy")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three 2-rank jobs side by side, forked from one launcher that imports torch once:
    their ranks start without an import, and mostly wait (the hang's sleep, the survivors'
    8 s timeout), so the jobs take the longest one's time."""
    root = tmp_path_factory.mktemp("fr-jobs")
    done = subprocess.run([sys.executable, str(JOB), str(root), ",".join(MODES), "2"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return {mode: root / mode for mode in MODES}


def _alone(run: Path, tmp_path: Path) -> Path:
    """The run's dumps in a folder of their own (what a user collects from the nodes)."""
    folder = tmp_path / f"{run.name}-dumps"
    shutil.copytree(run / FR_DIR, folder)
    return folder


def _without_dumps(run: Path, tmp_path: Path) -> Path:
    folder = tmp_path / f"{run.name}-records"
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns(FR_DIR, "*.pkl", ".store"))
    return folder


def _first(report: dict[str, Any]) -> dict[str, Any]:
    return report["findings"][0]


def test_the_hang_is_named_from_records_dumps_and_both(jobs: dict[str, Path], tmp_path) -> None:
    run = jobs["hang"]
    for path in (run, _alone(run, tmp_path), _without_dumps(run, tmp_path)):
        report = analyze_path(path)
        first = _first(report)
        assert report["summary"]["status"] == "hung", (path, report["summary"])
        assert first["rule"] == "FLR001" and first["ranks"] == [1], (path, first["title"])
        assert "never joined all_reduce #3" in first["title"], first["title"]
    both = analyze_path(run)
    assert "step 2" in _first(both)["title"]
    witness = _first(both)["evidence"]["flight_recorder"]
    assert witness and witness[0]["missing"] == [1] and witness[0]["seq"] == 3


def test_the_desync_is_named_from_records_dumps_and_both(jobs: dict[str, Path], tmp_path) -> None:
    run = jobs["desync"]
    for path in (run, _alone(run, tmp_path), _without_dumps(run, tmp_path)):
        report = analyze_path(path)
        first = _first(report)
        assert first["rule"] == "FLR003" and first["ranks"] == [1], (path, first["title"])
        assert "broadcast" in first["title"] and "type mismatch" in first["title"]
        # the survivors' timeouts are consequences: no crash is blamed
        assert not [f for f in report["findings"] if f["rule"] == "FLR002"]


def test_the_healthy_job_raises_no_failure_finding(jobs: dict[str, Path], tmp_path) -> None:
    run = jobs["healthy"]
    report = analyze_path(run)
    assert report["summary"]["status"] == "completed"
    assert not [f for f in report["findings"] if f["rule"].startswith("FLR")]
    alone = analyze_path(_alone(run, tmp_path))
    assert not [f for f in alone["findings"] if f["rule"].startswith("FLR")]


def test_torchs_pickled_dumps_read_without_globals_like_their_json(jobs: dict[str, Path]) -> None:
    run = jobs["hang"]
    for rank in (0, 1):
        data = (run / f"fr-rank-{rank}.pkl").read_bytes()
        # the test trusts the file it wrote: the standard unpickler is the reference
        expected = pickle.loads(data)
        assert load_plain(data, MAX_FR_DUMP_BYTES, MAX_FR_OBJECTS, MAX_FR_DEPTH) == expected
        pickled = read_dump(run / f"fr-rank-{rank}.pkl")
        assert pickled == expected
        as_json = read_dump(run / FR_DIR / f"rank-{rank:05d}.json")
        seqs = [e["collective_seq_id"] for e in pickled["entries"]]
        assert seqs == [e["collective_seq_id"] for e in as_json["entries"]]
        assert all(e["frames"] for e in pickled["entries"])  # the stacks JSON lacks
