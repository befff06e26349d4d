"""Golden reports: the JSON report of a fixed corpus (a stored run of every trainer, a simulated
3D run, every folder of ../shared/real-traces) stays what it was, so that a refactor that means
to keep behaviour does. A change that means to change a report regenerates them:

    DIAG_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_golden_reports.py

and the diff of tests/data/golden-reports/ shows what changed, for review.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diag.api import diagnose, load_any
from diag.read.kineto import is_trace_dir, load_trace_dir

DATA = Path(__file__).resolve().parents[1] / "data"
RUNS = DATA / "golden-runs"
REPORTS = DATA / "golden-reports"
REAL_TRACES = Path(__file__).resolve().parents[3] / "shared" / "real-traces"
REGENERATE = os.environ.get("DIAG_REGEN_GOLDEN") == "1"
RELATIVE_TOLERANCE = 1e-9
"""Floats may differ in the last bits between CPUs (vectorised sums); nothing more."""
SIMULATED = {
    "sim-3d": ["--ranks", "16", "--layout", "dp=2,tp=2,pp=2,ep=2", "--experts", "4",
               "--gpus-per-node", "4", "--steps", "4", "--microbatches", "4",
               "--inject", "straggler:rank=5,ms=20"],
    "sim-interleaved": ["--ranks", "8", "--layout", "dp=2,pp=4", "--steps", "3",
                        "--microbatches", "8", "--schedule", "interleaved",
                        "--virtual-stages", "2"],
}  # fmt: skip


def _stored_runs() -> list[str]:
    return sorted(p.name for p in RUNS.iterdir() if p.is_dir())


def _real_traces() -> list[str]:
    if not REAL_TRACES.is_dir():
        return []
    return sorted(p.name for p in REAL_TRACES.iterdir() if is_trace_dir(p))


def normalised(report: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The report without what names this machine: the folder's path, the creation time."""
    text = json.dumps(report, sort_keys=True).replace(str(folder), "<RUN>")
    plain: dict[str, Any] = json.loads(text)
    plain.get("run", {}).pop("created", None)
    return plain


def check(name: str, report: dict[str, Any]) -> None:
    golden = REPORTS / f"{name}.json"
    if REGENERATE:
        REPORTS.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        return
    if not golden.is_file():
        pytest.fail(f"{golden} missing: DIAG_REGEN_GOLDEN=1 writes it")
    assert_same(json.loads(golden.read_text()), report, name)


def assert_same(expected: Any, actual: Any, where: str) -> None:
    if isinstance(expected, dict) and isinstance(actual, dict):
        assert sorted(expected) == sorted(actual), f"{where}: keys differ"
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        assert len(expected) == len(actual), f"{where}: {len(expected)} != {len(actual)} items"
        for i, (left, right) in enumerate(zip(expected, actual, strict=True)):
            assert_same(left, right, f"{where}[{i}]")
    elif isinstance(expected, float) and isinstance(actual, int | float):
        assert math.isclose(expected, actual, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12), (
            f"{where}: {expected} != {actual}"
        )
    else:
        assert expected == actual, f"{where}: {expected!r} != {actual!r}"


@pytest.mark.parametrize("name", _stored_runs())
def test_stored_run(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name  # a copy: the analysis may cache beside it
    shutil.copytree(RUNS / name, folder, ignore=shutil.ignore_patterns(".diag-cache"))
    _, report = diagnose(load_any(folder))
    check(name, normalised(report, folder))


@pytest.mark.parametrize("name", sorted(SIMULATED))
def test_simulated_run(name: str, tmp_path: Path) -> None:
    folder = tmp_path / name
    subprocess.run(
        [sys.executable, "-m", "diag", "simulate", *SIMULATED[name], "--out", str(folder)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    _, report = diagnose(load_any(folder))
    check(name, normalised(report, folder))


@pytest.mark.parametrize("name", _real_traces() or ["(absent)"])
def test_real_trace_folder(name: str) -> None:
    if name == "(absent)":
        pytest.skip(f"{REAL_TRACES} absent")
    folder = REAL_TRACES / name
    _, report = diagnose(load_trace_dir(folder, use_cache=False))
    check(f"real-{name}", normalised(report, folder))
