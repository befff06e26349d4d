"""One harness for every rule: each case's run must (or must not) trigger its rule; every rule
has both kinds of case and a complete docstring."""

from __future__ import annotations

import dataclasses

import pytest
from rule_cases import RuleCase, all_cases

from diag.metrics import compute_metrics
from diag.read.kineto import is_trace_dir, load_trace_dir
from diag.read.load import load_run
from diag.rules import REGISTRY, run_rules
from diag.rules.engine import DOC_SECTIONS

CASES = all_cases()


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c.code}-{'fires' if c.triggers else 'quiet'}"
)
def test_rule_case(case: RuleCase, runs) -> None:
    path = case.build(runs)
    run = load_trace_dir(path) if is_trace_dir(path) else load_run(path)  # profiler traces too
    metrics = compute_metrics(run)
    judgement = run_rules(run, metrics)
    assert not judgement.notes, f"{case.code}: a rule could not judge: {judgement.notes}"
    findings = [f for f in judgement.findings if f.rule == case.code]
    assert bool(findings) == case.triggers, f"{case.code}: {case.why}: {findings}"
    if case.triggers:
        assert findings[0].severity == case.severity, f"{case.code}: {case.why}: {findings[0]}"
    if case.triggers and case.ranks is not None:
        assert tuple(sorted(findings[0].ranks)) == case.ranks


def test_every_rule_has_a_trigger_and_a_quiet_case() -> None:
    for case in CASES:
        assert (case.severity is not None) == case.triggers, (
            f"{case.code}: {case.why}: a trigger case names its severity, a quiet one none"
        )
    for code in REGISTRY:
        kinds = {c.triggers for c in CASES if c.code == code}
        assert kinds == {True, False}, (
            f"{code} lacks a {'quiet' if True in kinds else 'trigger'} case"
        )


def test_every_rule_documents_its_sections_and_thresholds() -> None:
    for rule in REGISTRY.values():
        for section in DOC_SECTIONS:
            assert rule.section(section), f"{rule.code} has no {section}"
        for name, threshold in rule.thresholds.items():
            assert threshold.unit and threshold.help, f"{rule.code}.{name} lacks unit or help"


def test_a_finding_that_names_the_cause_of_others_ranks_first_with_their_severity() -> None:
    from diag.rules.engine import Finding, rank_findings

    effect = Finding(rule="BAL001", pattern=3, severity="high", title="straggler", margin=2.0)
    cause = Finding(
        rule="TRD001",
        pattern=2,
        severity="medium",
        title="step time grows",
        explains=["BAL001", "MOE002"],
    )
    other = Finding(rule="COM001", pattern=1, severity="high", title="exposed communication")
    ranked = rank_findings([effect, other, cause])
    assert [f.rule for f in ranked] == ["TRD001", "BAL001", "COM001"]
    assert ranked[0].severity == "high"
    # a cause whose consequences are absent keeps its own severity and place
    alone = Finding(
        rule="TRD001", pattern=2, severity="medium", title="step time grows", explains=["MOE002"]
    )
    assert [f.rule for f in rank_findings([alone, other])] == ["COM001", "TRD001"]
    assert alone.severity == "medium"


def test_a_rule_that_raises_fails_its_case(runs, monkeypatch) -> None:
    """The engine keeps a crashing rule from stopping the analysis; the harness must not let
    that hide the crash (its quiet case would pass with no finding)."""
    from diag.rules.engine import REGISTRY as rules

    def broken(ctx, limits):
        raise ZeroDivisionError("on purpose")

    (quiet,) = [c for c in CASES if c.code == "COM001" and not c.triggers][:1]
    monkeypatch.setitem(rules, "COM001", dataclasses.replace(rules["COM001"], fn=broken))
    with pytest.raises(AssertionError, match="could not judge"):
        test_rule_case(quiet, runs)


def test_the_engine_stamps_a_findings_code_and_pattern_from_the_registration(
    runs, monkeypatch
) -> None:
    """A rule says what it found; which rule it is and the pattern it evidences are the
    registration's (a finding that claims another code is stamped with its own)."""
    from diag.rules.engine import REGISTRY as rules
    from diag.rules.engine import Finding

    def claims_another(ctx, limits):
        return [Finding(rule="XYZ999", pattern=5, severity="low", title="on purpose")]

    monkeypatch.setitem(rules, "COM001", dataclasses.replace(rules["COM001"], fn=claims_another))
    run = load_run(runs.write({0: runs.simple_rank(), 1: runs.simple_rank()}))
    (stamped,) = [
        f for f in run_rules(run, compute_metrics(run)).findings if f.title == "on purpose"
    ]
    assert (stamped.rule, stamped.pattern) == ("COM001", rules["COM001"].pattern)


def test_moe_rules_take_a_named_layer(runs) -> None:
    """A layer label may be a name (the run format allows strings): MOE001-003 and TRD001
    report it as given (found by test_fuzz_readers: int('x') made the MoE rules fail)."""
    records: dict[int, list] = {}
    for rank in (0, 1):
        records[rank] = []
        for step in range(4):
            records[rank] += [
                runs.step(step, step * 100, step * 100 + 90),
                {"kind": "experts", "step": step, "layer": "x", "tokens": [50, 0, 0, 1 + 30 * step],
                 "dropped": 5, "capacity": 8},
            ]  # fmt: skip
    run = load_run(runs.write(records, runs.manifest(world_size=2, layout={"dp": 2})))
    judgement = run_rules(run, compute_metrics(run))
    assert not judgement.notes
    moe = [f for f in judgement.findings if f.rule.startswith("MOE")]
    assert moe and all(f.evidence["layer"] == "x" for f in moe)


def test_busy_imbalance_defers_to_the_straggler_rule_at_its_configured_limits(runs) -> None:
    """BAL002 stays quiet where BAL001 names the rank, judged at BAL001's thresholds as the
    user configured them: where they are raised so that BAL001 no longer names rank 1, the
    imbalance is BAL002's to report (it once asked BAL001 at its defaults)."""
    from rule_cases.balance import _dp

    run = load_run(_dp(runs, [40, 80, 42, 41]))
    metrics = compute_metrics(run)
    codes = {f.rule for f in run_rules(run, metrics).findings}
    assert "BAL001" in codes and "BAL002" not in codes
    strict = {"BAL001": {"busy_ratio": 3.0, "min_cost_share": 1.0}}
    found = {f.rule: f for f in run_rules(run, metrics, strict).findings}
    assert "BAL001" not in found
    assert found["BAL002"].ranks == [1]


def test_the_stragglers_are_found_once_an_analysis(runs, monkeypatch) -> None:
    """BAL001, BAL002 and the rules that ask whether a straggler explains their finding share
    one search (RuleContext.derived_once): it ran up to five times an analysis."""
    from rule_cases.balance import _dp

    from diag.rules.families import balance

    calls = []
    search = balance.find_stragglers

    def counted(*args, **kwargs):
        calls.append(1)
        return search(*args, **kwargs)

    monkeypatch.setattr(balance, "find_stragglers", counted)
    run = load_run(_dp(runs, [40, 80, 42, 41]))
    findings = run_rules(run, compute_metrics(run)).findings
    assert "BAL001" in {f.rule for f in findings}
    assert len(calls) == 1


def test_a_collective_that_moved_no_bytes_is_the_ledgers_farthest_off(runs) -> None:
    """COM004 ranks how far off each collective is either way (max(r, 1/r)); a ratio of 0
    (a record of 0 bytes against the ledger's 1000, as the fuzz test wrote one) divided by
    zero, and the rule was skipped."""
    rows = {r: [runs.step(0, 0, 20), runs.comm(0, 10, 15, bytes=1000, expected_bytes=1000),
                runs.step(1, 20, 40),
                runs.comm(1, 30, 35, bytes=0, expected_bytes=1000, tag="empty")]
            for r in range(2)}  # fmt: skip
    run = load_run(runs.write(rows))
    judgement = run_rules(run, compute_metrics(run))
    assert not judgement.notes, judgement.notes
    (found,) = [f for f in judgement.findings if f.rule == "COM004"]
    assert found.title.startswith("all_reduce on dp moves 0.00x")
