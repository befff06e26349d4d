"""A layout diag could not read is stated as unknown wherever a report is read again: the
report JSON's nulls (tests/data/golden-reports, real traces) give no dp=world or m=1 to the
comparison's label, the MFU's tokens, a plan check, or `diag plan --from`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.metrics.flops import with_overrides
from diag.outputs.compare import layout_label
from diag.plan.verdict import check_against_plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden-reports" / "real-hta-alltoall-world16.json"
TRACES = ROOT.parent / "shared" / "real-traces" / "hta-alltoall-world16"


@pytest.fixture(scope="module")
def report() -> dict:
    """A real 16-rank trace folder whose layout the traces cannot say (all-to-alls and
    gradient reduction, no process groups)."""
    return json.loads(GOLDEN.read_text())


def test_the_report_states_the_unknown_axes_as_null(report: dict) -> None:
    assert report["run"]["layout_source"].startswith("unknown")
    layout = report["run"]["layout"]
    assert [layout[k] for k in ("dp", "tp", "pp", "ep", "cp", "microbatches")] == [None] * 6


def test_compare_labels_it_unknown_not_dp1(report: dict) -> None:
    assert layout_label(report["run"]) == "layout unknown"


def test_tokens_from_a_model_batch_need_the_layout(report: dict) -> None:
    # with dp unknown, sequences per micro-batch do not give the job's tokens per step
    report = {**report, "summary": {**report["summary"], "step_time_s": 1.0}}
    priced = with_overrides(report, "layers=4,hidden=256,seq=128,vocab=1000,batch=2")
    assert priced["summary"]["model_tflops_per_gpu"] is None
    assert "layout" in priced["summary"]["mfu_note"]
    # the same run with its layout stated gets them
    stated = {**report["run"], "layout": {**report["run"]["layout"], "dp": 16, "tp": 1, "pp": 1,
                                          "ep": 1, "cp": 1, "microbatches": 1}}  # fmt: skip
    priced = with_overrides(
        {**report, "run": stated}, "layers=4,hidden=256,seq=128,vocab=1000,batch=2"
    )
    assert priced["summary"]["model_tflops_per_gpu"] > 0


def test_a_plan_check_says_the_layout_is_unknown(report: dict) -> None:
    report = {**report, "summary": {**report["summary"], "step_time_s": 1.0}}
    violations, problem = check_against_plan(report, {"layouts": []}, 0.25)
    assert violations == [] and problem is not None and "unknown" in problem
    # a layout read, its ZeRO stage or gradient accumulation not: no plan entry is assumed
    known = {"dp": 2, "tp": 1, "pp": 1, "ep": 1, "cp": 1, "microbatches": 1, "virtual_stages": 1}
    for unread, said in (("zero_stage", "ZeRO stage"), ("grad_accum", "gradient accumulation")):
        layout = {**known, "zero_stage": 0, "grad_accum": 1, unread: None}
        stated = {**report, "run": {**report["run"], "layout": layout}}
        violations, problem = check_against_plan(stated, {"layouts": []}, 0.25)
        assert violations == [] and problem is not None and said in problem, problem


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/real-traces is absent")
def test_plan_from_a_folder_of_unknown_layout_asks_for_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["plan", "--from", str(TRACES), "--model", "llama3-8b"])
    assert result.exit_code == 2, result.output
    assert "--run-layout" in result.output and "unknown" in result.output
