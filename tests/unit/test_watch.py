"""`diag watch` without a job (tests/distributed/test_watch.py runs one): the rank files are read
a poll at a time, whole lines only, hostile lines skipped with a note; findings are reported
when they appear, change or go (after two analyses without them); a finished run is read to its
end; and the straggler that starts midway (`from=S`) in the injections, the simulator and the
trainers' fault plan."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag.cli.main import main
from diag.cli.watch import FindingLog, watch
from diag.contract import injections as inj
from diag.contract.limits import MAX_JSON_DEPTH
from diag.errors import InputError
from diag.read.growing import RunTail
from simulator.injections import parse_faults

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden-runs"


def _step(step: int, t0: int) -> str:
    return json.dumps({"kind": "step", "step": step, "t0": t0, "t1": t0 + 10, "tokens": 8})


def test_only_whole_lines_are_read_and_only_once(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp", tmp_path / "run")
    tail = RunTail(run)
    manifest = tail.manifest()
    assert manifest is not None
    tail.poll(manifest)
    before = {kind: len(rows) for kind, rows in tail.records.items()}
    last = tail.finished_step(manifest.world_size)
    assert last == max(r["step"] for r in tail.records["step"])
    tail.poll(manifest)  # nothing appended: nothing new
    assert {kind: len(rows) for kind, rows in tail.records.items()} == before
    rank_file = run / "rank-00000.jsonl"
    with rank_file.open("a") as fh:  # a line being written: no newline yet
        fh.write(_step(last + 1, 10**9)[:20])
    tail.poll(manifest)
    assert len(tail.records["step"]) == before["step"]
    with rank_file.open("a") as fh:
        fh.write(_step(last + 1, 10**9)[20:] + "\n")
    tail.poll(manifest)
    assert len(tail.records["step"]) == before["step"] + 1
    assert tail.finished_step(manifest.world_size) == last  # rank 1 has not finished it


def test_hostile_lines_are_skipped_with_a_note(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp", tmp_path / "run")
    with (run / "rank-00001.jsonl").open("a") as fh:
        fh.write("{not json\n")
        fh.write("[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "\n")
        fh.write(json.dumps({"kind": "step", "step": -3, "t0": 1, "t1": 2}) + "\n")
    tail = RunTail(run)
    manifest = tail.manifest()
    assert manifest is not None
    tail.poll(manifest)
    notes = " | ".join(tail.skipped)
    assert "not valid JSON" in notes and "nested too deeply" in notes
    assert "a record skipped" in notes
    assert all(r["step"] >= 0 for r in tail.records["step"])


def test_the_window_keeps_the_last_steps_and_drops_older_records(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp", tmp_path / "run")
    tail = RunTail(run, window_steps=2)
    manifest = tail.manifest()
    assert manifest is not None
    tail.poll(manifest)
    last = tail.finished_step(manifest.world_size)
    assert last is not None
    window = tail.window(manifest, last)
    assert sorted(window.steps["step"].unique()) == [last - 1, last]
    assert not window.starts_at_warmup
    assert min(r["step"] for r in tail.records["span"]) == last - 1


def _finding(rule: str, ranks: list[int], severity: str = "medium") -> dict[str, object]:
    return {"rule": rule, "ranks": ranks, "severity": severity, "title": f"{rule} title",
            "pattern": 3}  # fmt: skip


def test_findings_are_reported_when_new_changed_or_gone_twice() -> None:
    log = FindingLog()
    first = log.update([_finding("BAL001", [2])], step=5)
    assert len(first) == 1 and first[0].startswith("step 5  new   MED") and "BAL001" in first[0]
    assert log.update([_finding("BAL001", [2])], step=6) == []
    assert log.update([_finding("BAL001", [2], "high")], step=7)[0].startswith("step 7  now   HIGH")
    assert log.update([], step=8) == []  # one window without it: not yet gone
    assert log.update([_finding("BAL001", [2], "high")], step=9) == []
    assert log.update([], step=10) == []
    assert log.update([], step=11) == ["step 11  gone  BAL001 BAL001 title"]
    # another rank is another finding
    assert log.update([_finding("BAL001", [3])], step=12)[0].startswith("step 12  new")


def test_a_finished_run_is_read_to_its_end(tmp_path: Path) -> None:
    run = shutil.copytree(GOLDEN / "dp-straggler", tmp_path / "run")
    out = io.StringIO()
    assert watch(run, interval_s=0.1, out=out) == "complete"
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("diag watch: run complete after step")
    assert any("[BAL001," in line and "rank 1" in line for line in lines), lines


def test_no_manifest_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no readable manifest\.json"):
        watch(tmp_path, interval_s=0.1, wait_s=0.2)
    result = CliRunner().invoke(main, ["watch", str(tmp_path), "--wait", "0.2"])
    assert result.exit_code == 2 and "no readable manifest.json" in result.output


def test_a_straggler_from_a_step_is_slow_from_that_step_only() -> None:
    late = inj.parse_injection("straggler:rank=2,ms=80,from=10")
    assert late == inj.Straggler(rank=2, ms=80.0, from_step=10)
    assert inj.parse_injection("straggler:rank=1,ms=5").from_step == 0  # type: ignore[union-attr]
    assert [inj.compute_delay_ms([late], 2, step) for step in (0, 9, 10, 30)] == [0, 0, 80, 80]
    assert inj.compute_delay_ms([late], 1, 30) == 0
    with pytest.raises(ValueError, match=r"from=.x. is not an integer"):
        inj.parse_injection("straggler:rank=2,ms=80,from=x")
    faults = parse_faults(["straggler:rank=2,ms=80,from=10", "straggler:rank=0,ms=5"], 4, 0)
    assert (faults.compute_delay_ns(9) / 1e6).tolist() == [5, 0, 0, 0]
    assert (faults.compute_delay_ns(10) / 1e6).tolist() == [5, 0, 80, 0]
    assert (faults.compute_delay_ns(9) / 1e6).tolist() == [5, 0, 0, 0]  # no state kept


def test_the_trainers_fault_plan_follows_the_step() -> None:
    from reference_runs.faults import FaultPlan

    plan = FaultPlan.from_specs(["straggler:rank=2,ms=80,from=10"], rank=2)
    assert (plan.compute_delay_s(9), plan.compute_delay_s(10)) == (0.0, 0.08)
