"""Issue 40's "Done when" on real gloo jobs: the README's own loop (tests/distributed/readme_job.py)
on 3 ranks, rank 2 failing in its forward of step 3 (hang, crash, desync, kill), and a reference
trainer other than dp (pp) hanging. The first finding names the rank, the step and the collective
(or the exception) from the run directory alone, from its Flight Recorder dumps alone (which hold
no steps: the rank and the collective) and from both; the healthy loop raises no failure finding;
`diag watch`, run beside the hanging job, names the silent rank within 3 median steps + 5 s of
the hang's start and exits 1 once the job died; `diag check` exits 1 on every failed run.
One launch per failure, shared with test_failure_evidence.py (tests/distributed/readme_runs.py;
benchmarks/failure_matrix.py runs all of them).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag.api import analyze_path
from diag.cli.main import main as diag_main
from diag.errors import InputError
from diag.rankfile.convert import rank_file, rank_records
from diag.read.flight_recorder import FR_DIR, dump_files
from tests.distributed.readme_runs import FAILURES, RANK, RANKS, STEP, events, records

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def hang(readme_hang: dict[str, Any]) -> dict[str, Any]:
    """The hanging loop alone on the machine (its timing is measured), `diag watch` beside it:
    launched once per session (tests/distributed/readme_runs.py)."""
    return readme_hang


@pytest.fixture(scope="module")
def failed(readme_failures: Any) -> dict[str, Path]:
    """The crash, the desync, the kill and the healthy loop (launched once per session, with the
    pp hang: tests/distributed/readme_runs.py)."""
    runs = readme_failures.get([*FAILURES, "healthy"])
    return {name: run["run"] for name, run in runs.items()}


@pytest.fixture(scope="module")
def pp_hang(readme_failures: Any) -> Path:
    """`diag run pp --nproc 4 --inject hang:...`, launched with the README loop's failures
    (tests/distributed/readme_runs.py)."""
    done = readme_failures.get(["pp-hang"])["pp-hang"]
    assert done["returncode"] != 0, done["output"][-3000:]
    return done["run"]


def _sources(run: Path, tmp: Path) -> dict[str, Path]:
    """The run directory alone (its dumps left out), its dumps alone, and both."""
    alone = tmp / f"{run.parent.parent.name}-{run.name}-records"
    if not alone.exists():
        shutil.copytree(run, alone, ignore=shutil.ignore_patterns(FR_DIR))
    return {"records": alone, "dumps": run / FR_DIR, "both": run}


def _first(path: Path) -> dict[str, Any]:
    report = analyze_path(path)
    assert report["findings"], f"{path}: no finding"
    return report["findings"][0]


def _collective(first: dict[str, Any]) -> dict[str, Any]:
    """The collective the finding names: a hang's, a lost rank's that it never joined (its
    `collective` is where it stopped, a phrase), a desync's own evidence."""
    evidence = first["evidence"]
    return evidence.get("never_joined") or evidence.get("collective") or evidence


def _check(run: Path) -> int:
    # a limit every run holds: the check of a finished run has something to check (exit 0),
    # and a run that did not finish fails whatever its limits (exit 1); in process: the
    # command's exit code without a Python start per run
    return CliRunner().invoke(diag_main, ["check", str(run), "--max-comm-share", "1"]).exit_code


def _assert_hang_named(run: Path, tmp: Path, op: str | None = None, p2p: bool = False) -> None:
    for source, path in _sources(run, tmp).items():
        if source == "dumps" and p2p:
            # known gap: gloo's dumps give a send or recv no peer and their sequence numbers
            # do not pair across ranks, so the dumps alone name no rank (never a wrong one)
            named = {r for f in analyze_path(path)["findings"] for r in f["ranks"]}
            assert named <= {RANK}, named
            continue
        first = _first(path)
        assert first["rule"] == "FLR001", (source, first["title"])
        assert first["ranks"] == [RANK], (source, first["title"])
        stuck = _collective(first)
        assert stuck["missing"] == [RANK] and stuck["op"], (source, first["title"])
        assert op is None or stuck["op"] == op, (source, first["title"])
        if source != "dumps":  # a dump holds no steps
            assert stuck["step"] == STEP, (source, first["title"])


def test_a_hang_is_named_from_the_records_the_dumps_and_both(hang, tmp_path) -> None:
    _assert_hang_named(hang["run"], tmp_path, "all_reduce")
    missing = _first(hang["run"])["evidence"]["missing_ranks"][0]
    assert missing["step"] == STEP and missing["span"].startswith("fwd")
    assert "readme_job.py" in (missing["stack_top"] or "")  # the line that blocks


def test_watch_names_the_silent_rank_in_time_and_fails_when_the_job_died(hang) -> None:
    recs = rank_records(rank_file(hang["run"], RANK), [])
    opened = [r["t0"] for r in recs if r.get("name") == "span_open" and r["step"] == STEP]
    assert opened, "rank 2's open forward of the hanging step is in its file"
    report = analyze_path(hang["run"])
    bound_s = 3 * report["failure"]["median_step_s"] + 5
    named = [(t, line) for t, line in hang["watch_lines"] if f"rank {RANK}" in line]
    assert named, "\n".join(line for _, line in hang["watch_lines"])
    latency_s = (named[0][0] - min(opened)) / 1e9
    print(f"diag watch named rank {RANK} {latency_s:.2f} s after its hang (bound {bound_s:.2f} s)")
    assert latency_s <= bound_s, (latency_s, bound_s, named[0][1])
    assert hang["watch_rc"] == 1, hang["watch_lines"][-3:]


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failure_is_named_from_the_records_the_dumps_and_both(failure, failed, tmp_path) -> None:
    run = failed[failure]
    for source, path in _sources(run, tmp_path).items():
        if source == "dumps" and failure in ("desync", "kill"):
            # the aborted or killed rank leaves no dump and gloo retires the entries that
            # errored: the dumps alone hold nothing open, and the analysis says it cannot tell
            if path.is_dir() and not dump_files(path):  # cut off while written, if begun
                with pytest.raises(InputError, match="no Flight Recorder dump could be read"):
                    analyze_path(path)
            elif path.is_dir():
                first = _first(path)
                assert first["rule"] in ("FLR001", "FLR003", "FLR005"), first["title"]
            continue
        first = _first(path)
        if source == "dumps" and len(dump_files(path)) < RANKS:
            # the launcher ends the others once rank 2 raised, some before they dump: a rank
            # without a dump is unknown, so rank 2 is named where a dumped rank waits for it,
            # the run undecidable where none does, and never another rank
            assert first["ranks"] == ([RANK] if first["rule"] == "FLR001" else []), first
            assert first["rule"] in ("FLR001", "FLR005"), first["title"]
            continue
        assert first["ranks"] == [RANK], (source, first["title"])
        if failure == "crash" and source != "dumps":
            assert first["rule"] == "FLR002", (source, first["title"])
            assert first["evidence"]["exception"]["step"] == STEP
            assert first["evidence"]["exception"]["type"] == "RuntimeError"
            continue
        assert first["rule"] in ("FLR001", "FLR003", "FLR004"), (source, first["title"])
        stuck = _collective(first)
        assert stuck.get("op") or stuck.get("collective"), (source, first["title"])
        if source != "dumps":
            steps = {stuck.get("step"), first["evidence"].get("step")}
            assert STEP in steps, (source, first["title"])


def test_a_reference_trainer_other_than_dp_hangs_and_is_named(pp_hang, tmp_path) -> None:
    _assert_hang_named(pp_hang, tmp_path, p2p=True)
    # the evidence it leaves: the hanging rank stalls inside the injection, and a rank it
    # holds up waits in a collective of that step (its last in-flight record)
    (stall,) = events(records(pp_hang, RANK), "stall")
    assert stall["step"] == STEP and stall["stack"][-1]["function"] == "apply_failure"
    held = [e[-1] for r in range(4) if r != RANK and (e := events(records(pp_hang, r),
                                                                   "comm_issued"))]  # fmt: skip
    assert any(issued["step"] == STEP for issued in held), held


def test_the_healthy_loop_raises_no_failure_finding(failed) -> None:
    report = analyze_path(failed["healthy"])
    assert report["summary"]["status"] == "completed"
    assert not [f for f in report["findings"] if f["rule"].startswith("FLR")]
    assert _check(failed["healthy"]) == 0


def test_check_exits_1_on_every_failed_run(hang, failed, pp_hang) -> None:
    for run in (hang["run"], *(failed[f] for f in FAILURES), pp_hang):
        assert _check(run) == 1, run
