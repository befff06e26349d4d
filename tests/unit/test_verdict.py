"""What the designed pages lead with (diag/outputs/verdict.py, html_page.py), without a browser:
the ranks a finding singles out, each finding as a card with its severity in words, the run's
facts, the status slot and the failure block (tests/browser/ looks at the pages drawn)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from diag import analyze_path, failure_rows, singled_out_ranks, summary_items, verdicts
from diag.outputs.html_page import page as html_page

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden-runs"


def _report(findings: list[dict[str, Any]], ranks: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "run": {"run_id": "job", "world_size": ranks, "layout": {"dp": ranks}, "status": "complete",
                "trainer": "dp", "device_type": "cuda", "backend": "nccl"},
        "summary": {"ranks_analysed": ranks, "step_time_s": 0.3154, "steps_analysed": 7,
                    "first_step_analysed": 1, "last_step_analysed": 7, "tokens_per_s": 12345.0,
                    "mfu": 0.41, "model_tflops_per_gpu": 405.0, "comm_share": 0.2,
                    "exposed_comm_share": 0.1},
        "ranks": [{"rank": r} for r in range(ranks)],
        "findings": findings,
        "skipped": [],
        **extra,
    }  # fmt: skip


HOST = {
    "rule": "HST001",
    "pattern": 3,
    "severity": "low",
    "title": "host vm: ranks wait",
    "ranks": [0, 1, 2, 3],
    "advice": "pin threads",
    "cost_s": 0.08,
    "cost_share": 0.25,
}
STRAGGLER = {
    "rule": "BAL001",
    "pattern": 3,
    "severity": "high",
    "title": "straggler: rank 2",
    "ranks": [2],
    "advice": "look at rank 2",
    "cost_s": 0.04,
    "cost_share": 0.12,
}
PITFALL = {"rule": "PIT001", "pattern": None, "severity": "medium", "title": "a <b>pitfall</b>",
           "ranks": [], "advice": None, "cost_s": None}  # fmt: skip


def test_only_the_ranks_a_finding_singles_out_are_blamed() -> None:
    assert singled_out_ranks(_report([HOST, STRAGGLER])) == [2]  # not 0-3: the host is the job's
    # the same host finding on 4 of 8 ranks singles those out
    assert singled_out_ranks(_report([HOST, STRAGGLER], ranks=8)) == [0, 1, 2, 3]
    assert singled_out_ranks(_report([PITFALL])) == []


def test_a_card_says_what_who_cost_fix_and_the_catalogue_after() -> None:
    host, straggler, pitfall = verdicts(_report([HOST, STRAGGLER, PITFALL]))
    assert (straggler.severity, straggler.severity_text) == ("high", "HIGH")
    assert straggler.who == "rank 2" and straggler.singled_out
    assert straggler.cost == "costs 12% of the step (40.0 ms)"
    assert straggler.fix == "look at rank 2"
    assert straggler.catalogue == "BAL001 · pattern 3: speedup below theory"
    assert host.who == "ranks 0-3 (every rank: the whole job)" and not host.singled_out
    assert pitfall.severity_text == "MEDIUM" and pitfall.cost == "" and pitfall.fix == ""
    assert pitfall.catalogue == "PIT001 · configuration pitfall"


def test_the_run_facts_read_as_a_summary() -> None:
    facts = dict(summary_items(_report([])))
    assert facts["ranks"] == "4 (dp=4)"
    assert facts["recorded by"] == "the dp reference trainer on cuda, nccl"
    assert facts["mean step"] == "315.4 ms over steps 1-7 (7 steps)"
    assert facts["MFU"] == "41% (405 TFLOP/s a GPU)"
    assert facts["status"] == "complete"
    report = _report([])
    report["summary"]["ranks_analysed"] = 3
    assert dict(summary_items(report))["ranks"] == "3 of 4 (dp=4)"


def test_the_html_page_leads_with_the_cards_and_escapes_every_name() -> None:
    page = html_page(_report([STRAGGLER, HOST, PITFALL]), [])
    cards = re.findall(r'<article class="card (\w+)" data-severity="\w+"><div>'
                       r'<span class="sev">(\w+)</span>', page)  # fmt: skip
    assert cards == [("high", "HIGH"), ("low", "LOW"), ("medium", "MEDIUM")]
    assert page.index("<h2>Findings</h2>") < page.index("<h2>The run</h2>")
    assert '<dd class="who blamed">rank 2</dd>' in page
    assert '<dd class="who">ranks 0-3 (every rank: the whole job)</dd>' in page
    assert "a &lt;b&gt;pitfall&lt;/b&gt;" in page and "<b>pitfall" not in page
    assert 'id="failure"' not in page  # a job that finished: no failure block
    healthy = html_page(_report([]), [])
    assert '<article class="card ok"' in healthy and "No finding" in healthy


def test_a_job_that_did_not_finish_opens_with_where_each_rank_stopped() -> None:
    stopped = [{"rank": 0, "state": "timed out", "step": 6, "span": "bwd",
                "collective": "all_reduce #41 of dp", "waited_s": 20.0, "stack_top": "wait"},
               {"rank": 1, "state": "stalled", "step": 6, "span": "fwd <i>",
                "collective": "never joined all_reduce #41 of dp"}]  # fmt: skip
    report = _report([STRAGGLER], where_stopped=stopped)
    report["summary"]["status"] = "hung"
    header, rows = failure_rows(report)
    assert header == ["rank", "state", "step", "span", "collective", "waited s", "stack top"]
    assert rows[0] == ["0", "timed out", "6", "bwd", "all_reduce #41 of dp", "20", "wait"]
    assert rows[1][:5] == ["1", "stalled", "6", "fwd <i>", "never joined all_reduce #41 of dp"]
    page = html_page(report, [])
    assert 'class="status failed" id="run-status">status: hung<' in page
    assert page.index('id="failure"') < page.index("<h2>Findings</h2>")
    assert "<h2>where each rank stopped</h2>" in page and "fwd &lt;i&gt;" in page


@pytest.mark.parametrize("run", ["dp-straggler"])
def test_a_real_run_blames_its_straggler_only(run: str) -> None:
    report = analyze_path(GOLDEN / run)
    assert singled_out_ranks(report) == [1]
    assert verdicts(report)[0].who == "rank 1"
