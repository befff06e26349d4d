"""Every step of a rank measured at once on bands of the time axis (step_bands.py) gives what
measuring each step alone gives: the same records from real and simulated traces, and no
step's computation covering, or a send's wait read from, another step's kernels where the
steps overlap in time."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.read.kineto import step_bands
from diag.read.kineto.files import parse_file
from diag.read.kineto.kernels import KernelPatterns
from diag.read.kineto.send_waits import RESUME_WITHIN_NS
from diag.read.kineto.trace_folder import trace_files

REAL_TRACES = Path(__file__).parents[3] / "shared" / "real-traces"


def _records(path: Path) -> str:
    return repr(sorted(parse_file(path, KernelPatterns()).records.items()))


def _traces(tmp_path: Path) -> list[Path]:
    out = tmp_path / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--layout", "dp=2,pp=2", "-m", "4", "--steps", "4", "--format", "kineto",
        "--out", str(out), "--inject", "straggler:rank=1,ms=20",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    found = sorted(out.glob("*.json"))
    for name in ("hta-alltoall-world16", "hta-nccl-world2", "hta-large-216k-events"):
        folder = REAL_TRACES / name
        found += trace_files(folder)[:1] if folder.is_dir() else []
    return found


def test_the_steps_measured_together_give_the_records_of_each_step_measured_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = _traces(tmp_path)
    together = [_records(path) for path in paths]
    monkeypatch.setattr(step_bands, "LARGEST_BANDED", 1)  # no two steps' bands fit: one each
    assert [_records(path) for path in paths] == together
    assert any("comm_wait" in records for records in together)  # waits were measured


def _banded(steps: list[list[tuple[int, int, bool]]]) -> tuple[step_bands.Covered, np.ndarray]:
    """Kernels given per step as (start, end, is communication), in that order."""
    kernels = [kernel for step in steps for kernel in step]
    t0 = np.array([k[0] for k in kernels], dtype=np.int64)
    t1 = np.array([k[1] for k in kernels], dtype=np.int64)
    comm = np.array([k[2] for k in kernels])
    firsts = np.cumsum([0] + [len(step) for step in steps])
    found = step_bands.bands(t0, t1, t0, [np.arange(a, b) for a, b in pairwise(firsts)])
    covered = step_bands.Covered.none(len(kernels))
    everything = np.arange(len(kernels))
    shifted = t0 + found.shift
    covered.add(shifted, t1 + found.shift, shifted, everything[~comm], everything[comm])
    return covered, found.shift


def test_a_step_s_computation_covers_its_own_collectives_only() -> None:
    # step 0: computes 0-100, a collective 50-150; step 1 computes 120-200 (it overlaps step 0)
    covered, shift = _banded([[(0, 100, False), (50, 150, True)],
                              [(120, 200, False), (90, 130, True)]])  # fmt: skip
    assert covered.hidden_ns.tolist() == [0, 50, 0, 10]  # 120-130 of step 1's own
    assert shift[0] == shift[1] != shift[2] == shift[3]


def test_a_send_s_wait_is_not_read_from_the_next_step_s_computation() -> None:
    # step 0's send ends at its last time; step 1 computes from its first time on, which its
    # band puts just after step 0's (all the steps are as long): no resumption read from it
    width = 1_000_000
    late = width - 100
    covered, _ = _banded([[(0, 10, False), (20, width, True)],
                          [(width, width + 10, False), (late, late + width, True)]])  # fmt: skip
    assert not covered.waited.any()
    # within a step, a computation resuming as the send ends is its wait
    resumes = width + RESUME_WITHIN_NS
    covered, _ = _banded([[(0, 10, False), (20, width, True), (resumes, resumes + 5, False)]])
    assert covered.waited.tolist() == [False, True, False]
