"""A rank's excess is costed once: the replay's cause for the rank is host time or compute,
whichever removing saves more, and a busy-time finding (BAL001) beside a host-time one
(BAL005) claims only what its compute at the peers' median saves (a loaded CI host read a
100 ms data fetch's traces with 9 ms of compute noise as BAL001 first, both at the whole
saving)."""

from __future__ import annotations

import pandas as pd

from diag.rules.costs import attach_costs
from diag.rules.engine import rank_findings
from diag.rules.model import Finding
from diag.whatif.attribution import Attribution
from diag.whatif.causes import Cause, CauseKind

STEP_S = 0.130


def _attribution(kind: CauseKind, host_s: float, compute_s: float) -> Attribution:
    saved = 0.107
    cause = Cause(kind, "rank 1", saved, saved / STEP_S, ranks=[1],
                  evidence={"host_saving_s": host_s, "compute_saving_s": compute_s})  # fmt: skip
    return Attribution(
        measured_step_s=STEP_S, replayed_step_s=STEP_S, replay_error=0.0, steps_replayed=4,
        causes=[cause], ideal_step_s=0.02, all_transfers_s=0.001, balanced_s=saved,
        waits=pd.DataFrame(),
    )  # fmt: skip


def _findings() -> list[Finding]:
    busy = Finding(rule="BAL001", pattern=3, severity="high", title="busy", ranks=[1], margin=1.2)
    host = Finding(rule="BAL005", pattern=3, severity="medium", title="host", ranks=[1],
                   explains=["BAL003"])  # fmt: skip
    return [busy, host]


def test_host_time_is_first_and_the_busy_finding_claims_only_its_compute() -> None:
    findings = _findings()
    attach_costs(findings, _attribution(CauseKind.HOST, 0.100, 0.009), None)
    ranked = rank_findings(findings)
    assert [f.rule for f in ranked] == ["BAL005", "BAL001"]
    assert ranked[0].cost_s == 0.107
    assert ranked[1].cost_s == 0.009
    assert ranked[1].severity == "low"  # 7% of the step earns no more


def test_a_compute_straggler_keeps_the_whole_saving() -> None:
    findings = _findings()
    attach_costs(findings, _attribution(CauseKind.STRAGGLER, 0.009, 0.100), None)
    busy, host = findings
    assert busy.cost_s == 0.107
    assert host.cost_s == 0.0  # no host cause: the replay read the excess as compute
    assert rank_findings(findings)[0].rule == "BAL001"
