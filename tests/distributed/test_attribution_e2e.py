"""A straggler in every trainer is the main finding, named by rank, and what the replay says it
costs is what removing it saves, within 30% on 2 ranks (which do not oversubscribe this
machine's 2 cores).

What removing it saves is measured within one run whose straggler appears midway (`from=S`):
its steps from S on against its steps before S, less what those already lose to the same cause
(a pipeline's own stage imbalance). Two separate runs, one with the straggler and one without,
compared two moments of this loaded machine: the healthy dp step read 21-73 ms from run to run,
so the saving of an 80 ms sleep measured 45-95 ms while the replay put it at 73-81 ms in most
steady steps; 3 of 6 such pairs missed the 30%.

Load still moves within one run, and it moves the healthy step most: there both ranks compute
at once, where beside a sleeping straggler the other rank computes alone, and the replay
(durations as measured) cannot know that two ranks computing together on two busy cores are
slower. That costs a fixed 10-25 ms; dp's sleep is 240 ms so that it stays well inside the 30%
(at 80 ms, 1 of 8 such runs missed: 1.38; at 240 ms, 5 of 5 within 0.96-1.04, 2 of them beside
a spinning process). pp sleeps 80 ms in each of its 8 micro-batches (7 of 7 within 0.97-1.22).

The healthy half begins at step 2: step 0 is the warm-up, and step 1 is left out as a margin.
(In step 1's forward DDP rebuilds its buckets with a broadcast that every rank joins, where
rank 0 waits out rank 1's sleep; the DDP collector records it as a blocking broadcast, so that
the wait reads as waiting, not compute: tested below.)

The main-finding test sleeps 80 ms a micro-batch, except in zero3, whose step (micro-batch 64,
FSDP2's gathers on two busy cores) is 0.6-0.7 s: there 80 ms is 11-12% of the step, the busy
ratio ~1.18 stays under BAL001's 1.3, and the finding rests on the replay's 10% cost share, so
a loaded CI machine read it as COM003 once. 240 ms is the same fault at a margin the noise
cannot cross."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from diag.api import analyze_path
from diag.metrics import compute_metrics
from diag.read.load import load_run
from tests.distributed.test_rules_e2e_healthy import HEALTHY

pytestmark = pytest.mark.dist

STRAGGLER = "straggler:rank=1,ms=80"
STRAGGLER_OF = {"zero3": "straggler:rank=1,ms=240"}  # see the module docstring
COST_WITHIN = 0.30
FIRST_STEADY = 2  # the first step measured without the straggler (see the module docstring)
MIDWAY = {  # trainer: (the sleep per micro-batch in ms, its first step, of twice as many)
    "dp": (240, 10),  # one micro-batch a step: 240 ms against a 20-70 ms step
    "pp": (80, 8),  # 8 micro-batches a step: 640 ms against a 100-450 ms step
}


def straggler_run(shared_run: Callable[..., Path], trainer: str) -> Path:
    """The healthy run of `trainer` (test_rules_e2e_healthy.py) with rank 1 a straggler, once
    per session. All but dp's record profiler traces from step 2 on: test_traces_agree.py
    reads the same runs through their traces (the profiler slows every rank alike; that test
    holds the run's own main finding to more than this one does). dp's stays unprofiled: its
    bucket rebuild in step 1 is measured against the compute of its later steps."""
    args = [*HEALTHY[trainer], "--inject", STRAGGLER_OF.get(trainer, STRAGGLER)]
    if trainer != "dp":
        args += ["--profile-steps", f"2:{args[args.index('--steps') + 1]}"]
    return shared_run(trainer, *args)


def _main(report: dict) -> dict:
    return report["findings"][0]


def _with_steps(args: list[str], num_steps: int) -> list[str]:
    """`args` with the value of `--steps` replaced by `num_steps`."""
    at = args.index("--steps")
    return [*args[: at + 1], str(num_steps), *args[at + 2 :]]


@pytest.mark.parametrize("trainer", list(HEALTHY))
def test_a_straggler_is_the_main_finding(trainer: str, shared_run) -> None:
    report = analyze_path(straggler_run(shared_run, trainer))
    main = _main(report)
    ranked = [(f["rule"], f["ranks"], f.get("cost_s")) for f in report["findings"]]
    assert main["ranks"] == [1], f"{trainer}: {ranked}"
    assert main["pattern"] != 1 and main["cost_s"] > 0


@pytest.mark.parametrize("trainer", list(MIDWAY))
def test_its_cost_is_what_removing_it_saves(trainer: str, shared_run) -> None:
    ms, midway = MIDWAY[trainer]
    args = _with_steps(HEALTHY[trainer], 2 * midway)
    run = shared_run(trainer, *args, "--inject", f"straggler:rank=1,ms={ms},from={midway}")
    with_it = analyze_path(run, steps=range(midway, 2 * midway))
    without = analyze_path(run, steps=range(FIRST_STEADY, midway))
    saved_s = with_it["attribution"]["measured_step_s"] - without["attribution"]["measured_step_s"]
    main = _main(with_it)
    assert main["ranks"] == [1], f"{trainer}: {main['rule']} {main['ranks']}"
    # what the healthy steps already lose to the same cause (a pipeline's own stage imbalance)
    before = [f["cost_s"] for f in without["findings"] if f["rule"] == main["rule"]]
    cost_s = main["cost_s"] - sum(before)
    assert cost_s == pytest.approx(saved_s, rel=COST_WITHIN), f"{trainer}: {cost_s=} {saved_s=}"
    assert with_it["attribution"]["replay_error"] <= 0.05


def test_ddps_bucket_rebuild_is_recorded_as_waiting(shared_run) -> None:
    """Beside rank 1's 80 ms sleep, rank 0 computes no longer in step 1 than later: its wait in
    DDP's bucket rebuild inside that forward is a recorded broadcast, not compute (it read as
    compute before: rank 0's forward took 96 ms, against 7 ms later)."""
    run = load_run(straggler_run(shared_run, "dp"))
    rebuilt = run.comms[run.comms["tag"] == "ddp.buckets"]
    assert sorted(rebuilt["rank"]) == [0, 1] and set(rebuilt["step"]) == {1}, rebuilt
    assert set(rebuilt["op"]) == {"broadcast"} and rebuilt["blocking"].all()
    # rank 0 waited out most of the 80 ms sleep in the broadcast, recorded as such ...
    mine = rebuilt[rebuilt["rank"] == 0]
    waited_ms = float((mine["t1"] - mine["t0"]).sum()) / 1e6
    assert waited_ms >= 40, rebuilt
    # ... and its step 1 computes less than the sleep beyond its later steps: the first step's
    # own costs (allocations, the rebuild itself) stay, 7-44 ms on this loaded machine, where
    # the wait read as compute made it 89 ms
    busy = compute_metrics(run).rank_steps.set_index(["rank", "step"])["busy_s"] * 1e3
    later_ms = float(busy.loc[0].loc[2:].median())
    assert busy.loc[(0, 1)] - later_ms < 60, busy.round(1).to_dict()
