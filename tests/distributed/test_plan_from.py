"""diag plan --from: calibrated on a 2-rank 1F1B pipeline, it predicts that run's step within
15% and another layout of the same model on this machine (interleaved, v=2, twice the
micro-batches) within 40%, measured by running it.

Why pipeline to pipeline: on this 2-core machine a DP run's two ranks compute at once while a
pipeline's alternate, so a hog beside the tests takes a different share of each; the achieved
FLOP/s of DP and PP runs differ by up to 3x under load (docs/plan.md, "Limits").

Why both runs at once, over the steps they share: the machine's load (other tests) moves a
run's compute rate by 2x within minutes, so two runs made one after the other compare two
moments, not two layouts. Launched together, each sees the other and the same neighbours;
the calibration and the measurement keep only the steps inside the window where both ran
(the 1F1B run has twice the steps, its steps being shorter, so that the window holds most of
the interleaved run's even when one job starts seconds after the other)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import diag
from diag.plan.calibrate import calibrate, job_of
from diag.plan.timing import step_time
from tests.distributed.conftest import diag_run

pytestmark = pytest.mark.dist

MODEL = ("--layers", "4")
ONE_F_ONE_B = (*MODEL, "--steps", "32", "--microbatches", "4")
INTERLEAVED = (*MODEL, "--steps", "16", "--microbatches", "8", "--schedule", "interleaved",
               "--virtual-stages", "2")  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("plan-from")
    with ThreadPoolExecutor(2) as pool:
        made = [
            pool.submit(diag_run, root / "1f1b", *ONE_F_ONE_B, trainer="pp"),
            pool.submit(diag_run, root / "interleaved", *INTERLEAVED, trainer="pp"),
        ]
        for future in made:
            future.result()
    return root / "1f1b", root / "interleaved"


def _shared_steps(a: Any, b: Any) -> tuple[Any, Any]:
    """Both runs restricted to the steps that ran wholly while the other was stepping too
    (and their first step, which the calibration drops as the warm-up)."""
    start = max(a.steps["t0"].min(), b.steps["t0"].min())
    end = min(a.steps["t1"].max(), b.steps["t1"].max())

    def within(run: Any) -> Any:
        bounds = run.steps.groupby("step").agg(t0=("t0", "min"), t1=("t1", "max"))
        shared = bounds.index[(bounds["t0"] >= start) & (bounds["t1"] <= end)]
        assert len(shared) >= 3, f"only {len(shared)} steps of {run.path} overlap the other run"
        keep = set(shared) | {bounds.index.min()}
        tables = {k: getattr(run, k) for k in ("steps", "spans", "comms")}
        return replace(run, **{k: t[t["step"].isin(keep)] for k, t in tables.items()})

    return within(a), within(b)


def test_from_run_predicts_itself_and_another_layout(runs: tuple[Path, Path]) -> None:
    measured_path, other_path = runs
    measured_run, other = _shared_steps(diag.load_any(measured_path), diag.load_any(other_path))
    cal = calibrate(measured_run, str(measured_path))
    same = step_time(cal.job, cal.layout, cal.cluster).step_s
    assert same == pytest.approx(cal.measured_step_s, rel=0.15)
    job, layout = job_of(other, str(other_path))
    assert (layout.pp, layout.v, layout.microbatches) == (2, 2, 8)
    predicted = step_time(job, layout, cal.cluster)
    measured = calibrate(other, str(other_path)).measured_step_s
    assert predicted.pp_bubble_s < step_time(cal.job, cal.layout, cal.cluster).pp_bubble_s * 2
    # interleaving: v times the messages, each at the latency measured on the 1F1B run
    assert predicted.pp_p2p_s > step_time(cal.job, cal.layout, cal.cluster).pp_p2p_s * 2
    assert predicted.step_s == pytest.approx(measured, rel=0.40), (predicted.step_s, measured)
