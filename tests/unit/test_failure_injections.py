"""The injections that end a job (`hang`, `crash`, `desync`, `kill`: diag/contract/injections.py,
reference_runs/faults.py): parsed, applied by the one rank at the one step, once. The trainers
share `FaultPlan.apply_failure` (dp and zero3 through common.accumulated_step, tp, pp and ep in
their own steps); tests/distributed/test_failure_evidence.py runs a trainer end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from collectors import Recorder
from diag.contract.injections import (
    Crash,
    Desync,
    Hang,
    Kill,
    ends_job,
    failure_at,
    parse_injection,
)
from reference_runs import common, ep, pp, tp
from reference_runs.faults import FAILURE_PG_TIMEOUT_S, FaultPlan
from simulator.injections import parse_faults
from tests.unit.collector_helpers import _clean_env, of_kind, read_records  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("hang:rank=2,step=3", Hang(2, 3)), ("crash:rank=0,step=1", Crash(0, 1)),
     ("desync:rank=1,step=0", Desync(1, 0)), ("kill:rank=3,step=5", Kill(3, 5))],
)  # fmt: skip
def test_the_failure_specs_parse(spec: str, expected: object) -> None:
    assert parse_injection(spec) == expected
    assert ends_job([parse_injection(spec)])


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("hang:rank=1", "missing required key(s) step"),
     ("kill:step=1", "missing required key(s) rank"),
     ("crash:rank=1,step=-1", "must be >= 0"),
     ("desync:rank=1,step=2,ms=3", "unknown key 'ms'")],
)  # fmt: skip
def test_bad_failure_specs_say_why(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=f"bad injection '{spec}'") as info:
        parse_injection(spec)
    assert reason in str(info.value)


def test_only_the_named_rank_fails_and_only_at_its_step() -> None:
    injections = [parse_injection("slow-comm:ms=1"), parse_injection("crash:rank=1,step=2")]
    assert failure_at(injections, 1, 2) == Crash(1, 2)
    assert failure_at(injections, 0, 2) is None and failure_at(injections, 1, 1) is None
    assert not ends_job(injections[:1])
    healthy = FaultPlan.from_specs(["crash:rank=1,step=2"], rank=0)
    healthy.apply_failure(2)  # another rank: nothing happens
    plan = FaultPlan.from_specs(["crash:rank=1,step=2"], rank=1)
    plan.apply_failure(1)
    with pytest.raises(RuntimeError, match="injected crash: rank 1 at step 2"):
        plan.apply_failure(2)
    plan.apply_failure(2)  # once: the step's later micro-batches do not fail again


def test_the_process_group_timeout_is_short_under_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DIAG_PG_TIMEOUT_S", raising=False)
    assert (
        FaultPlan.from_specs(["hang:rank=0,step=1"], rank=0).pg_timeout_s() == FAILURE_PG_TIMEOUT_S
    )
    assert FaultPlan.from_specs(["slow-comm:ms=1"], rank=0).pg_timeout_s() is None
    monkeypatch.setenv("DIAG_PG_TIMEOUT_S", "7.5")
    assert FaultPlan.from_specs([], rank=0).pg_timeout_s() == 7.5
    monkeypatch.setenv("DIAG_PG_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="DIAG_PG_TIMEOUT_S"):
        FaultPlan.from_specs([], rank=0).pg_timeout_s()


def test_every_trainer_applies_the_failure_before_its_forward() -> None:
    """dp and zero3 step through common.accumulated_step; tp, pp and ep have their own steps:
    each calls apply_failure inside its forward span, before the compute delay."""
    for module in (common, tp, pp, ep):
        source = Path(module.__file__ or "").read_text()
        assert source.count("apply_failure(step_index") == 1, module.__name__
        failure = source.index("apply_failure(step_index")
        assert failure < source.index("apply_compute_delay(step_index"), module.__name__


def test_the_simulator_refuses_a_failure_it_does_not_model() -> None:
    with pytest.raises(ValueError, match="does not model a job that fails"):
        parse_faults(["hang:rank=0,step=1"], world=2, experts=0)


def test_a_desync_issues_one_extra_collective_recorded_in_flight(tmp_path: Path) -> None:
    """On a 1-rank gloo group (the collective completes): one 1-element all-reduce, recorded
    as issued (flushed before it is launched) and completed, tag `inject.desync`."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        rec = Recorder(tmp_path / "run", watchdog=False)
        plan = FaultPlan.from_specs(["desync:rank=0,step=1"], rank=0)
        with rec.step():
            plan.apply_failure(1, rec)
            plan.apply_failure(1, rec)  # once
        rec.close()
    finally:
        dist.destroy_process_group()
    records = read_records(tmp_path / "run")
    (issued,) = of_kind(records, "event", name="comm_issued")
    (done,) = of_kind(records, "comm", tag="inject.desync")
    assert issued["seq"] == done["seq"] == 1 and done["bytes"] == issued["bytes"] == 4
    assert done["group_ranks"] == [0]


@pytest.mark.parametrize("kind", ["kill", "hang"])
def test_a_kill_ends_the_process_and_a_hang_never_returns(kind: str) -> None:
    code = (f"from reference_runs.faults import FaultPlan; "
            f"plan = FaultPlan.from_specs(['{kind}:rank=0,step=1'], rank=0); "
            f"print('ready', flush=True); plan.apply_failure(1)")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        try:
            returncode = job.wait(timeout=10 if kind == "kill" else 2)
        except subprocess.TimeoutExpired:
            returncode = None
    finally:
        job.kill()
        job.wait()
    assert returncode == (-signal.SIGKILL if kind == "kill" else None)
