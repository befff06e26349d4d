"""A run's profiler traces (`--profile-steps`) give the same main finding as its records: the
path a user takes with a job the project did not instrument (issue: right on data the project
did not write). gloo on CPU: the step thread's operators, gloo's events, no tags, no peers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diag.api import analyze_path
from tests.distributed.conftest import diag_run
from tests.distributed.test_attribution_e2e import straggler_run
from tests.distributed.test_injections_e2e import LOADER_STALL

pytestmark = pytest.mark.dist


def _main(report: dict) -> dict:
    assert report["findings"], "no finding"
    return report["findings"][0]


@pytest.fixture(scope="module")
def slow_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("stage-slow") / "run"
    diag_run(run, "--pp", "2", "--layers", "4", "--microbatches", "4", "--steps", "5",
             "--inject", "stage-slow:stage=0,ms=40", "--profile-steps", "2:5",
             trainer="pp")  # fmt: skip
    return run


def test_a_slow_stage_is_named_first_in_the_run_and_in_its_traces(slow_stage: Path) -> None:
    for path in (slow_stage, slow_stage / "traces"):
        main = _main(analyze_path(path))
        assert main["rule"] == "PIP003", (path, main["rule"], main["title"])
        assert main["ranks"] == [0], (path, main)
        assert main["cost_share"] > 0.05, (path, main)


@pytest.fixture(scope="module")
def dp_straggler(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("dp-straggler") / "run"
    diag_run(run, "--steps", "5", "--inject", "straggler:rank=1,ms=100",
             "--profile-steps", "2:5")  # fmt: skip
    return run


def test_a_dp_straggler_is_named_first_in_its_traces(dp_straggler: Path) -> None:
    """In a trace the injected sleep is time between the step thread's operators: the rank's
    own time, costed by the replay (the waiting peer's all-reduce outlives its release)."""
    for path in (dp_straggler, dp_straggler / "traces"):
        main = _main(analyze_path(path))
        assert main["ranks"] == [1], (path, main["rule"], main["title"])
        assert main["cost_share"] > 0.3, (path, main)


FAULTS_THROUGH_TRACES = ["tp-straggler", "pp-straggler", "ep-straggler", "zero3-straggler",
                         "dp-loader-stall"]  # fmt: skip
"""A straggler in each trainer but dp (the runs of test_attribution_e2e.py, profiled from step 2
on: `straggler_run`), and dp's loader stall (test_injections_e2e.py's run)."""


@pytest.mark.parametrize("name", FAULTS_THROUGH_TRACES)
def test_a_fault_names_its_rank_first_in_the_run_and_in_its_traces(name: str, shared_run) -> None:
    """Every trainer's profiler traces give the main finding its run directory gives: the same
    rank and the same cause. A sleep between the step thread's operators inside the step is the
    rank's own work there, as the run's spans count it (compute: BAL001, or its stage's
    PIP003), and a data fetch before the step's first operator its host time (BAL005)."""
    trainer, fault = name.split("-", 1)
    if fault == "straggler":
        run = straggler_run(shared_run, trainer)
    else:
        run = shared_run(trainer, *LOADER_STALL)
    found = {}
    for path in (run, run / "traces"):
        main = _main(analyze_path(path))
        assert main["ranks"] == [1], (path, main["rule"], main["title"])
        assert main["rule"] in ("BAL001", "BAL005", "PIP003"), (path, main["rule"])
        assert main["cost_share"] > 0.1, (path, main)
        found[path.name] = main["rule"]
    assert found["traces"] == found["run"], found


def _read_alone(traces: Path, into: Path) -> dict:
    """The report of a run's traces copied away from its manifest (as a user's folder is)."""
    shutil.copytree(traces, into)
    return analyze_path(into)


def test_the_zero_stage_is_read_from_traces_alone(
    shared_run, dp_straggler: Path, tmp_path: Path
) -> None:
    """A FSDP2 job's traces, read with no manifest beside them, say ZeRO-3 (parameters
    gathered before the gradients' reductions, more gathers than reductions); a DDP job's
    ZeRO-0 (all-reduces only). The gradient accumulation they do not say: null."""
    for run, stage in ((straggler_run(shared_run, "zero3"), 3), (dp_straggler, 0)):
        report = _read_alone(run / "traces", tmp_path / f"zero{stage}")
        layout = report["run"]["layout"]
        assert layout["dp"] == 2 and layout["zero_stage"] == stage, report["run"]
        assert f"ZeRO-{stage} read: " in report["run"]["layout_source"]
        assert layout["grad_accum"] is None
        ops = {row["op"] for row in report["collectives"]}
        # gloo runs FSDP's reduce-scatters as all-reduces: named by the c10d op that issued them
        assert ops == ({"all_gather", "reduce_scatter"} if stage == 3 else {"all_reduce"}), ops


def _bytes_per_step(report: dict) -> dict[str, float]:
    """Each op's bytes per rank-step, over every group and tag."""
    found: dict[str, float] = {}
    for row in report["collectives"]:
        found[row["op"]] = found.get(row["op"], 0.0) + (row["bytes_per_step"] or 0.0)
    return found


def test_gloo_collectives_are_sized_from_the_recorded_shapes(
    shared_run, dp_straggler: Path
) -> None:
    """gloo writes no message sizes; the shapes the profiler records (`record_shapes`, as our
    profiler and most users' run it) give them: the `gloo:` event's tensor and the `c10d::` op
    that issued it (gloo_sizes.py). DDP's bucket all-reduces and FSDP2's gathers (the whole
    output, not a rank's part) and reductions carry, per step, the bytes the run directory
    measured of the same steps."""
    for run in (dp_straggler, straggler_run(shared_run, "zero3")):
        ours, traced = analyze_path(run, steps=range(2, 5)), analyze_path(run / "traces")
        expected = _bytes_per_step(ours)
        assert expected and all(expected.values()), ours["collectives"]
        assert _bytes_per_step(traced) == pytest.approx(expected, rel=0.01), (run, traced)
