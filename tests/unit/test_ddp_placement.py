"""A data-parallel job whose only process group is the world: DDP's bucket all-reduces start
early in the step (a short forward pass) but overlap the backward's computation, so they are
gradient reduction, not tensor parallelism. The layout reads dp=world (it read "layout unknown:
tensor-parallel collectives inside the forward pass ..." and claimed no straggler)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.api import analyze_path
from diag.cli.main import main
from diag.read.kineto import load_trace_dir


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 DDP ranks (8 layers of 4096: the first bucket's all-reduce starts a fifth into the
    step), rank 1 a straggler."""
    folder = tmp_path_factory.mktemp("ddp") / "traces"
    result = CliRunner().invoke(main, [
        "simulate", "--ranks", "2", "--steps", "4", "--format", "kineto", "--out", str(folder),
        "--inject", "straggler:rank=1,ms=50",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder


def test_early_bucket_all_reduces_overlapping_compute_read_as_data_parallel(ddp: Path) -> None:
    run = load_trace_dir(ddp)
    early = run.comms[run.comms["t0"] - run.comms["step"].map(
        run.steps.groupby("step")["t0"].min()) < 0.25 * 0.116e9]  # fmt: skip
    assert not early.empty and not early["blocking"].any()  # the case: early, not blocking
    layout = run.manifest.layout
    assert (layout.dp, layout.tp, layout.pp) == (2, 1, 1), run.manifest.layout_source
    assert not run.manifest.layout_unknown


def test_its_straggler_is_named_at_its_run_directory_s_cost(ddp: Path, tmp_path: Path) -> None:
    """Nothing given (`diag analyze FOLDER`, a user's path): the straggler and its cost as the
    same simulated run's directory gives them."""
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "simulate", "--ranks", "2", "--steps", "4", "--out", str(run_dir),
        "--inject", "straggler:rank=1,ms=50",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    first, truth = analyze_path(ddp)["findings"][0], analyze_path(run_dir)["findings"][0]
    assert (first["rule"], first["ranks"]) == (truth["rule"], truth["ranks"]) == ("BAL001", [1])
    assert first["cost_s"] == pytest.approx(truth["cost_s"], rel=0.2)
