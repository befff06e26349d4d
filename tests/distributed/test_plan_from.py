"""diag plan --from: calibrated on a 2-rank 1F1B pipeline, it predicts that run's step within
15% and another layout of the same model on this machine (interleaved, v=2, twice the
micro-batches) within 40%, measured by running it.

Why pipeline to pipeline: on this 2-core machine a DP run's two ranks compute at once while a
pipeline's alternate, so a hog beside the tests takes a different share of each; the achieved
FLOP/s of DP and PP runs differ by up to 3x under load (docs/plan.md, "Limits")."""

from __future__ import annotations

from pathlib import Path

import pytest

import diag
from diag.plan.calibrate import calibrate, job_of
from diag.plan.timing import step_time
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

MODEL = ("--steps", "8", "--layers", "4")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("plan-from")
    diag_run(root / "1f1b", *MODEL, "--microbatches", "4", trainer="pp")
    diag_run(root / "interleaved", *MODEL, "--microbatches", "8", "--schedule", "interleaved",
             "--virtual-stages", "2", trainer="pp")  # fmt: skip
    return root / "1f1b", root / "interleaved"


def test_from_run_predicts_itself_and_another_layout(runs: tuple[Path, Path]) -> None:
    measured_path, other_path = runs
    cal = calibrate(diag.load_any(measured_path), str(measured_path))
    same = step_time(cal.job, cal.layout, cal.cluster).step_s
    assert same == pytest.approx(cal.measured_step_s, rel=0.15)
    other = diag.load_any(other_path)
    job, layout = job_of(other, str(other_path))
    assert (layout.pp, layout.v, layout.microbatches) == (2, 2, 8)
    predicted = step_time(job, layout, cal.cluster)
    measured = calibrate(other, str(other_path)).measured_step_s
    assert predicted.pp_bubble_s < step_time(cal.job, cal.layout, cal.cluster).pp_bubble_s * 2
    assert predicted.step_s == pytest.approx(measured, rel=0.40), (predicted.step_s, measured)
